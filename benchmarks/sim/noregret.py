"""No regret (issue 17): miso+ against NoPart, OptSta and MISO at light load, busy load and on
fixed mixes, every policy on the same stream; and the ablation of miso+'s switches in every
regime.

    python benchmarks/sim/noregret.py [--jobs 1000] [--seeds 1-5] [--parts light,busy,fixed]
                                      [--ablation] [--json FILE]

* light: 40 GPUs, Poisson, mean inter-arrival 90 / 120 / 240 s, restart 30 / 120 / 300 s;
* busy: 40 and 16 GPUs, 60 s, restart 30 / 60 / 120 / 300 s (the restart-economy table);
* fixed: one GPU, k = 1..10 ten-minute jobs at t = 0 (restart 30 s and 120 s), with the best
  static layout in hindsight (every maximal layout and the whole GPU, jobs taking instances
  in submission order or fastest-slice first) beside them.

Prints Markdown tables; the "No regret" figures in benchmarks/README.md come from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from miso.mig import Placement, enumerate_layouts, geometry
from miso.sched import make_policy
from miso.sched.experiments import ToldRestartPrice
from miso.sim.engine import Simulator
from miso.sim.metrics import summarize
from miso.sim.run import fixed_jobs, run_policy
from miso.sim.traces import TraceJob, poisson_jobs
from miso.sim.world import WorldConfig

OTHERS = ("nopart", "optsta", "miso")
POLICIES = (*OTHERS, "miso+")
#: miso+ variants of the ablation (one switch from the defaults at a time).
ABLATION: dict[str, dict[str, Any]] = {
    "miso+ (all)": {},
    "profile always (issue-8 rule)": {"profile_when": "always"},
    "never profile (prior + observed rates)": {"profile_when": "never"},
    "- wait for a whole GPU": {"wait_for_gpu": False},
    "wait bias 1 (wait whenever it looks better)": {"wait_bias": 1.0},
    "- batch cap (4 at a time when restarts are dear)": {"batch_jobs": 0},
    "- batch horizon 0.75": {"batch_horizon_quantile": 0.5},
    "+ load known after 8 arrivals (off)": {"load_samples": 8},
    "- hold a GPU for a starving job": {"starve_after": 0.0},
    "share_margin 1 (profile from load + 1 sd)": {"share_margin": 1.0},
    "- learned restart costs (told restart_s)": {"restart_costs": ToldRestartPrice},
}


def seeds_of(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


def cell(jobs: list[TraceJob], cfg: WorldConfig, seed: int, variants: dict[str, dict]
         ) -> dict[str, dict[str, float]]:
    out = {p: summarize(run_policy(p, jobs, cfg, seed)) for p in OTHERS}
    for name, kw in variants.items():
        key = "miso+" if not kw else name
        out[key] = summarize(run_policy("miso+", jobs, cfg, seed, **kw))
    return out


def hindsight_static(jobs: list[TraceJob], cfg: WorldConfig, seed: int) -> float:
    """Best average JCT of any static layout (every maximal layout, and the whole GPU) in
    hindsight, jobs taking instances in submission order or with the fastest jobs first."""
    geom = geometry(cfg.gpu_model)
    full = (Placement(0, geom.model.full_profile().name),)
    layouts = [*enumerate_layouts(geom, maximal=True), full]
    speed = {j.id: sum(_truth(j.workload).values()) for j in jobs}
    orders = [list(jobs), sorted(jobs, key=lambda j: -speed[j.id])]
    best = float("inf")
    for lay in layouts:
        for order in orders:
            tj = [TraceJob(j.id, j.submit_s + 1e-6 * i, j.duration_s, j.workload)
                  for i, j in enumerate(order)]
            try:
                r = Simulator(make_policy("optsta", layout=lay), tj, cfg, seed=seed).run()
            except Exception:  # noqa: BLE001  (a layout with no instance for some job)
                continue
            best = min(best, float(r.jct.mean()))
    return best


def _truth(workload: str) -> dict[str, float]:
    from miso.sched.speeds import workload_speeds
    from miso.workloads import catalogue

    return workload_speeds(geometry("A100-40GB"), catalogue()[workload])


def table(title: str, rows: list[tuple[str, list[dict]]], variants: dict[str, dict]) -> dict:
    names = ["miso+" if not kw else n for n, kw in variants.items()]
    print(f"\n## {title}")
    print("| cell | " + " | ".join(OTHERS) + " | " + " | ".join(names)
          + " | miso+ / min(others) | miso+ <= all, every seed | miso+ restarts/job |")
    print("|---|" + "---|" * (len(OTHERS) + len(names) + 3))
    out = {}
    for label, per in rows:
        m = {p: statistics.mean(x[p]["avg_jct_s"] for x in per) for p in (*OTHERS, *names)}
        best = min(m[p] for p in OTHERS)
        wins = all(x["miso+"]["avg_jct_s"] <= min(x[p]["avg_jct_s"] for p in OTHERS) + 1e-6
                   for x in per)
        rs = statistics.mean(x["miso+"]["restarts_per_job"] for x in per)
        print(f"| {label} | " + " | ".join(f"{m[p]:.0f}" for p in OTHERS) + " | "
              + " | ".join(f"{m[n]:.0f}" for n in names)
              + f" | {m['miso+'] / best:.3f} | {wins} | {rs:.2f} |", flush=True)
        out[label] = per
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seeds", default="1-5", help="A-B (inclusive) or one seed")
    ap.add_argument("--parts", default="light,busy,fixed")
    ap.add_argument("--ablation", action="store_true", help="run every miso+ variant too")
    ap.add_argument("--json", default="benchmarks/sim/results/noregret.json")
    a = ap.parse_args()
    seeds = seeds_of(a.seeds)
    parts = a.parts.split(",")
    variants = ABLATION if a.ablation else {"miso+ (all)": {}}
    out: dict[str, Any] = {"jobs": a.jobs, "seeds": seeds}
    t0 = time.perf_counter()
    if "light" in parts:
        rows = []
        for iat in (90.0, 120.0, 240.0):
            for r in (30.0, 120.0, 300.0):
                per = [cell(poisson_jobs(a.jobs, seed=s, mean_interarrival_s=iat),
                            WorldConfig(n_gpus=40, restart_s=r), s, variants) for s in seeds]
                rows.append((f"40 GPUs, {iat:g} s, restart {r:g} s", per))
        out["light"] = table("Light load (avg JCT s, mean over seeds)", rows, variants)
    if "busy" in parts:
        rows = []
        for n in (40, 16):
            for r in (30.0, 60.0, 120.0, 300.0):
                per = [cell(poisson_jobs(a.jobs, seed=s), WorldConfig(n_gpus=n, restart_s=r),
                            s, variants) for s in seeds]
                rows.append((f"{n} GPUs, 60 s, restart {r:g} s", per))
        out["busy"] = table("Busy (avg JCT s, mean over seeds)", rows, variants)
        print("\n| cell | miso+/miso | miso+/optsta | miso+ p95 / optsta p95 |")
        print("|---|---|---|---|")
        for label, per in rows:
            m = {p: statistics.mean(x[p]["avg_jct_s"] for x in per) for p in POLICIES}
            p95 = {p: statistics.mean(x[p]["p95_jct_s"] for x in per) for p in POLICIES}
            print(f"| {label} | {m['miso+'] / m['miso']:.3f} | {m['miso+'] / m['optsta']:.3f}"
                  f" | {p95['miso+'] / p95['optsta']:.3f} |")
    if "fixed" in parts:
        fixed: dict[str, Any] = {}
        for r in (30.0, 120.0):
            rows = []
            limits = {}
            cfg = WorldConfig(n_gpus=1, restart_s=r)
            for k in range(1, 11):
                per = [cell(fixed_jobs(k, seed=s), cfg, s, variants) for s in seeds]
                limits[k] = statistics.mean(hindsight_static(fixed_jobs(k, seed=s), cfg, s)
                                            for s in seeds)
                rows.append((f"k={k}, restart {r:g} s (static limit {limits[k]:.0f})", per))
            fixed[f"{r:g}"] = {"cells": table(f"Fixed mixes, one GPU, restart {r:g} s", rows,
                                              variants), "static_limit": limits}
        out["fixed"] = fixed
    print(f"\n(wall {time.perf_counter() - t0:.0f} s)")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
