"""Simulator scaling: MISO run time against jobs and GPUs at the paper's load per GPU.

The mean inter-arrival time is scaled as 60 s x 40 / GPUs, which keeps the paper's offered load
(40 GPUs, one job per minute). Usage:

    .venv/bin/python benchmarks/sim/scale.py [--full] [--policy miso] [--json OUT]

Without --full: a grid up to 1,000 GPUs and 20,000 jobs; with --full also 1,000 GPUs x
100,000 jobs (a few minutes).
"""

from __future__ import annotations

import argparse
import json
import time

from miso.sim.metrics import summarize
from miso.sim.run import run_policy
from miso.sim.traces import poisson_jobs
from miso.sim.world import WorldConfig


def one(policy: str, gpus: int, jobs: int, seed: int = 1) -> dict[str, float]:
    iat = 60.0 * 40 / gpus
    tj = poisson_jobs(jobs, seed=seed, mean_interarrival_s=iat)
    t = time.perf_counter()
    r = run_policy(policy, tj, WorldConfig(n_gpus=gpus), seed)
    wall = time.perf_counter() - t
    s = summarize(r)
    return {"gpus": gpus, "jobs": jobs, "wall_s": round(wall, 2), "events": s["events"],
            "us_per_event": round(1e6 * wall / s["events"], 1),
            "avg_jct_s": round(s["avg_jct_s"], 1), "stp": round(s["stp"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--policy", default="miso")
    ap.add_argument("--json")
    a = ap.parse_args()
    grid = [(40, 1000), (100, 2500), (250, 6250), (1000, 5000), (1000, 10000),
            (1000, 20000), (100, 10000), (40, 10000)]
    if a.full:
        grid.append((1000, 100000))
    rows = []
    for g, n in grid:
        row = one(a.policy, g, n)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"policy": a.policy, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
