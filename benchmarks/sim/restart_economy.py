"""Restart economy (issue 8): miso+ against NoPart, OptSta and MISO when restarts cost what
they really cost, jobs that cannot checkpoint, the Philly trace, and the miso+ ablation.

    python benchmarks/sim/restart_economy.py [--seeds 5] [--json FILE]

Every cell runs the same trace and seed under every policy (ratios within one run). Prints
Markdown tables; the figures in benchmarks/README.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from miso.sim.metrics import summarize
from miso.sim.run import run_policy
from miso.sim.traces import load_trace, poisson_jobs
from miso.sim.world import WorldConfig

POLICIES = ("nopart", "optsta", "miso", "miso+")
ABLATION = {
    "miso+ (all)": {},
    "3 MPS levels instead of 2": {"profile_levels": (50, 14, 100)},
    "horizon = median remaining time (replans 1)": {"replans": 1.0},
    "replans 40": {"replans": 40.0},
    "no quiet-time growth (quiet_gaps 1e9)": {"quiet_gaps": 1e9},
    "- headroom kept for the next arrival": {"reserve": False},
}


def cell(jobs, cfg, seed, policies=POLICIES, **kw):  # noqa: ANN001, ANN201
    return {p: summarize(run_policy(p, jobs, cfg, seed, **(kw if p == "miso+" else {})))
            for p in policies}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", default="benchmarks/sim/results/restart_economy.json")
    ap.add_argument("--skip-ablation", action="store_true")
    a = ap.parse_args()
    seeds = range(1, a.seeds + 1)
    out: dict[str, object] = {}
    t0 = time.perf_counter()

    print("## Restart-cost sweep (1,000 Poisson jobs, 60 s; mean over seeds of avg JCT, p95)")
    print("| GPUs | restart s | nopart | optsta | miso | miso+ | miso+/miso | miso+/optsta "
          "| miso+ p95 / optsta p95 | miso+ restarts/job | miso+ <= all in every seed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    sweep = {}
    for n in (40, 16):
        for r in (30.0, 60.0, 120.0, 300.0):
            per = [cell(poisson_jobs(1000, seed=s), WorldConfig(n_gpus=n, restart_s=r), s)
                   for s in seeds]
            sweep[f"{n}/{r:g}"] = per
            m = {p: statistics.mean(x[p]["avg_jct_s"] for x in per) for p in POLICIES}
            p95 = {p: statistics.mean(x[p]["p95_jct_s"] for x in per) for p in POLICIES}
            rs = statistics.mean(x["miso+"]["restarts_per_job"] for x in per)
            wins = all(x["miso+"]["avg_jct_s"] <= min(x[p]["avg_jct_s"] for p in POLICIES)
                       for x in per)
            print(f"| {n} | {r:g} | " + " | ".join(f"{m[p]:.0f}" for p in POLICIES)
                  + f" | {m['miso+'] / m['miso']:.3f} | {m['miso+'] / m['optsta']:.3f} | "
                  f"{p95['miso+'] / p95['optsta']:.3f} | {rs:.2f} | {wins} |", flush=True)
    out["sweep"] = sweep

    print("\n## Jobs that cannot checkpoint (--no-checkpoint-frac 0.5, restart 120 s)")
    print("| GPUs | nopart | optsta | miso | miso+ | miso+/optsta | miso+/nopart |")
    print("|---|---|---|---|---|---|---|")
    nock = {}
    for n in (40, 16):
        per = [cell(poisson_jobs(1000, seed=s),
                    WorldConfig(n_gpus=n, restart_s=120.0, no_checkpoint_frac=0.5), s)
               for s in seeds]
        nock[str(n)] = per
        m = {p: statistics.mean(x[p]["avg_jct_s"] for x in per) for p in POLICIES}
        print(f"| {n} | " + " | ".join(f"{m[p]:.0f}" for p in POLICIES)
              + f" | {m['miso+'] / m['optsta']:.3f} | {m['miso+'] / m['nopart']:.3f} |",
              flush=True)
    out["no_checkpoint"] = nock

    print("\n## Philly trace (first 1,000 jobs; avg JCT, p95)")
    print("| GPUs | restart s | nopart | optsta | miso | miso+ | miso+/miso | miso+/optsta "
          "| miso+ p95 / optsta p95 |")
    print("|---|---|---|---|---|---|---|---|---|")
    philly = {}
    for n in (40, 16):
        for r in (30.0, 120.0, 300.0):
            jobs = load_trace("philly", seed=1, max_jobs=1000)
            x = cell(jobs, WorldConfig(n_gpus=n, restart_s=r), 1)
            philly[f"{n}/{r:g}"] = x
            m = {p: x[p]["avg_jct_s"] for p in POLICIES}
            print(f"| {n} | {r:g} | " + " | ".join(f"{m[p]:.0f}" for p in POLICIES)
                  + f" | {m['miso+'] / m['miso']:.3f} | {m['miso+'] / m['optsta']:.3f} | "
                  f"{x['miso+']['p95_jct_s'] / x['optsta']['p95_jct_s']:.3f} |", flush=True)
    out["philly"] = philly

    if not a.skip_ablation:
        print("\n## miso+ ablation (restart 120 s, seeds mean; avg JCT s / restarts per job)")
        print("| variant | 40 GPUs | 16 GPUs | 40 GPUs, 50 % no checkpoint |")
        print("|---|---|---|---|")
        abl = {}
        for name, kw in ABLATION.items():
            row = []
            for n, frac in ((40, 0.0), (16, 0.0), (40, 0.5)):
                cfg = WorldConfig(n_gpus=n, restart_s=120.0, no_checkpoint_frac=frac)
                xs = [summarize(run_policy("miso+", poisson_jobs(1000, seed=s), cfg, s, **kw))
                      for s in seeds]
                row.append((statistics.mean(x["avg_jct_s"] for x in xs),
                            statistics.mean(x["restarts_per_job"] for x in xs)))
            abl[name] = row
            print(f"| {name} | " + " | ".join(f"{j:.0f} / {r:.2f}" for j, r in row) + " |",
                  flush=True)
        out["ablation"] = abl
    print(f"\n(wall {time.perf_counter() - t0:.0f} s)")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
