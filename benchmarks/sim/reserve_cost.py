"""Headroom priced (issue 30, the ``reserve`` no-regret item): miso+ against MISO on a stream of
hours-long jobs at moderate load, and miso+ on the no-regret and restart-economy cells, so two
versions of the code can be compared cell by cell.

    python benchmarks/sim/reserve_cost.py [--seeds 1-3] [--parts hours,light,busy,fixed,philly]
                                         [--json FILE]

Run it once per version (``PYTHONPATH=OTHER/src`` for the other one) and compare the JSON
files with ``--compare A.json B.json`` (miso+ average JCT, B / A per cell and seed).

* hours: 16 GPUs, Poisson arrivals, MISO-trace workloads with lognormal durations (sigma 1)
  three times the MISO trace's mean (~2.3-2.5 h), about 20 GPU-equivalents offered (mean
  inter-arrival = mean duration / 20), restart 30 and 120 s: miso+, miso+ without
  ``reserve``, MISO.
* light / busy / fixed: the cells of ``noregret.py`` (miso+ only); philly: the first 1,000
  Philly jobs (``restart_economy.py``'s cells, 40 and 16 GPUs, restart 30 / 120 / 300 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from miso.sim.metrics import summarize
from miso.sim.run import fixed_jobs, run_policy
from miso.sim.traces import load_trace, poisson_jobs
from miso.sim.world import WorldConfig


def seeds_of(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


def avg(policy: str, jobs, cfg: WorldConfig, seed: int, **kw) -> float:  # noqa: ANN001
    return float(summarize(run_policy(policy, jobs, cfg, seed, **kw))["avg_jct_s"])


def hours_jobs(seed: int, n: int = 1000, offered: float = 20.0):  # noqa: ANN201
    kw = {"duration_scale": 3.0, "duration_dist": "lognormal", "duration_sigma": 1.0}
    mean = float(np.mean([j.duration_s for j in poisson_jobs(n, seed=seed, **kw)]))
    return poisson_jobs(n, seed=seed, mean_interarrival_s=mean / offered, **kw)


def run(parts: list[str], seeds: list[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    if "hours" in parts:
        for s in seeds:
            jobs = hours_jobs(s)
            for r in (30.0, 120.0):
                cfg = WorldConfig(n_gpus=16, restart_s=r)
                key = f"hours 16 GPUs restart {r:g} s seed {s}"
                out[f"{key} miso+"] = avg("miso+", jobs, cfg, s)
                out[f"{key} miso+ reserve off"] = avg("miso+", jobs, cfg, s, reserve=False)
                out[f"{key} miso"] = avg("miso", jobs, cfg, s)
                print(key, out[f"{key} miso+"] / out[f"{key} miso"],
                      out[f"{key} miso+ reserve off"] / out[f"{key} miso"], flush=True)
    cells = []
    if "light" in parts:
        cells += [(40, iat, r) for iat in (90.0, 120.0, 240.0) for r in (30.0, 120.0, 300.0)]
    if "busy" in parts:
        cells += [(n, 60.0, r) for n in (40, 16) for r in (30.0, 60.0, 120.0, 300.0)]
    for n, iat, r in cells:
        for s in seeds:
            key = f"{n} GPUs, {iat:g} s, restart {r:g} s seed {s} miso+"
            out[key] = avg("miso+", poisson_jobs(1000, seed=s, mean_interarrival_s=iat),
                           WorldConfig(n_gpus=n, restart_s=r), s)
            print(key, out[key], flush=True)
    if "fixed" in parts:
        for r in (30.0, 120.0):
            for k in range(1, 11):
                for s in seeds:
                    key = f"fixed k={k} restart {r:g} s seed {s} miso+"
                    out[key] = avg("miso+", fixed_jobs(k, seed=s),
                                   WorldConfig(n_gpus=1, restart_s=r), s)
    if "philly" in parts:
        jobs = load_trace("philly", seed=1, max_jobs=1000)
        for n in (40, 16):
            for r in (30.0, 120.0, 300.0):
                key = f"philly 1000 {n} GPUs restart {r:g} s miso+"
                out[key] = avg("miso+", jobs, WorldConfig(n_gpus=n, restart_s=r), 1)
                print(key, out[key], flush=True)
    return out


def compare(a: Path, b: Path) -> None:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    ratios = {k: y[k] / x[k] for k in x if k in y and "reserve off" not in k
              and not k.endswith(" miso")}
    groups: dict[str, list[float]] = {}
    for k, v in ratios.items():
        groups.setdefault(k.split(" seed ")[0].replace(" miso+", ""), []).append(v)
    print("| cell | miso+ after / before (per seed) | mean |")
    print("|---|---|---|")
    for g, vs in groups.items():
        print(f"| {g} | {' '.join(f'{v:.4f}' for v in vs)} | {statistics.mean(vs):.4f} |")
    print(f"worst {max(ratios.values()):.4f}, cells changed "
          f"{sum(abs(v - 1) > 1e-12 for v in ratios.values())} of {len(ratios)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--parts", default="hours,light,busy,fixed,philly")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args()
    if a.compare:
        compare(*a.compare)
        return
    out = run(a.parts.split(","), seeds_of(a.seeds))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
