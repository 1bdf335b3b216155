"""Simulator scaling: run time of each policy against jobs and GPUs at the paper's load per GPU.

The mean inter-arrival time is scaled as 60 s x 40 / GPUs, which keeps the paper's offered load
(40 GPUs, one job per minute). Wall time covers building the policy (OptSta's offline search
included) and the simulation. Usage:

    python benchmarks/sim/scale.py [--policy all|P[,P...]] [--full] [--gpus G --jobs N,N,...]
                                   [--json OUT]

Default grid: up to 1,000 GPUs and 20,000 jobs. ``--full``: 1,000 GPUs x 10,000, 30,000 and
100,000 jobs (the issue's target; minutes for all six policies). ``--gpus/--jobs``: that grid.
The table gives, per policy and GPU count with at least two job counts, the growth exponent of
wall time against jobs (least-squares slope of log time on log jobs; 1.0 is linear).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict

from miso.sim.metrics import summarize
from miso.sim.run import ALL_POLICIES, run_policy
from miso.sim.traces import poisson_jobs
from miso.sim.world import WorldConfig

DEFAULT_GRID = [(40, 1000), (100, 2500), (250, 6250), (40, 10000), (100, 10000),
                (1000, 5000), (1000, 10000), (1000, 20000)]
FULL_GRID = [(1000, 10000), (1000, 30000), (1000, 100000)]


def one(policy: str, gpus: int, jobs: int, seed: int = 1) -> dict[str, float | int | str]:
    iat = 60.0 * 40 / gpus
    tj = poisson_jobs(jobs, seed=seed, mean_interarrival_s=iat)
    t = time.perf_counter()
    r = run_policy(policy, tj, WorldConfig(n_gpus=gpus), seed)
    wall = time.perf_counter() - t
    s = summarize(r)
    return {"policy": policy, "gpus": gpus, "jobs": jobs, "events": int(s["events"]),
            "wall_s": round(wall, 2), "us_per_event": round(1e6 * wall / s["events"], 1),
            "avg_jct_s": round(s["avg_jct_s"], 1), "stp": round(s["stp"], 3)}


def exponent(rows: list[dict]) -> float | None:
    """Least-squares slope of log(wall) on log(jobs); None with fewer than two job counts."""
    pts = [(math.log(r["jobs"]), math.log(r["wall_s"])) for r in rows if r["wall_s"] > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def table(rows: list[dict]) -> str:
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["policy"], r["gpus"])].append(r)
    out = ["| policy | GPUs | jobs | events | wall s | us / event | exponent |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        e = exponent(groups[(r["policy"], r["gpus"])])
        out.append(f"| {r['policy']} | {r['gpus']:,} | {r['jobs']:,} | {r['events']:,} | "
                   f"{r['wall_s']:.1f} | {r['us_per_event']:.0f} | "
                   f"{'' if e is None else f'{e:.2f}'} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default="miso", help="'all' or comma-separated policy names")
    ap.add_argument("--full", action="store_true", help="1,000 GPUs x 10k, 30k, 100k jobs")
    ap.add_argument("--gpus", type=int, help="with --jobs: one GPU count")
    ap.add_argument("--jobs", help="with --gpus: comma-separated job counts")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    policies = list(ALL_POLICIES) if a.policy == "all" else a.policy.split(",")
    unknown = [p for p in policies if p not in ALL_POLICIES]
    if unknown:
        ap.error(f"unknown policy {unknown[0]!r}; known: {', '.join(ALL_POLICIES)}")
    if (a.gpus is None) != (a.jobs is None):
        ap.error("--gpus and --jobs go together")
    if a.gpus is not None:
        grid = [(a.gpus, int(n)) for n in a.jobs.split(",")]
    else:
        grid = FULL_GRID if a.full else DEFAULT_GRID
    rows = []
    for p in policies:
        for g, n in grid:
            row = one(p, g, n)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(table(rows))
    total = sum(r["wall_s"] for r in rows)
    print(f"total wall {total:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "total_wall_s": round(total, 2)}, f, indent=2)


if __name__ == "__main__":
    main()
