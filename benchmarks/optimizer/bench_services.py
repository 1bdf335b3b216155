"""Optimizer time per call with service replicas beside the jobs vs jobs only (issue 28).

Run: python benchmarks/optimizer/bench_services.py [--cases 1000]
An A100-40GB holds at most 7 instances, so "jobs + replicas" calls are 4 jobs + 3 replicas
(the replicas pinned on three 1g instances) and 7 jobs + 0 replicas is the jobs-only call
(fresh, and with the 7 jobs running, which is what miso+ asks); 4 jobs alone is shown too.
"4 jobs beside 3 replicas" is the call the scheduling core makes: the optimizer of the
geometry the replicas leave free (:func:`miso.mig.beside`, what ``ClusterState`` gives
training on a GPU hosting replicas), exact on those slices.
Same random speeds for all; median and p99 microseconds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from miso.mig import Placement, beside, geometry
from miso.optimize import optimizer_for
from miso.replicasolve import solve_beside_replicas


def speeds_for(geom, n: int, rng: random.Random) -> dict:
    names = [p.name for p in geom.profiles]
    return {f"j{j}": dict(zip(names, sorted((rng.uniform(0.1, 1.0) for _ in names),
                                            reverse=True), strict=True)) for j in range(n)}


def timed(fn, items) -> list[float]:
    out = []
    for it in items:
        t0 = time.perf_counter_ns()
        fn(it)
        out.append((time.perf_counter_ns() - t0) / 1000.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    geom = geometry("A100-40GB")
    opt = optimizer_for(geom)
    rng = random.Random(args.seed)
    reps = {"svc-a": Placement(0, "1g.5gb"), "svc-b": Placement(1, "1g.5gb"),
            "svc-c": Placement(2, "1g.5gb")}
    c7 = [speeds_for(geom, 7, rng) for _ in range(args.cases)]
    c4 = [speeds_for(geom, 4, rng) for _ in range(args.cases)]
    free = optimizer_for(beside(geom, reps.values()))
    for fn, items in ((opt.solve, c7[:50]), (opt.solve, c4[:50]),
                      (lambda s: solve_beside_replicas(opt, s, reps), c4[:50]),
                      (free.solve, c4[:50])):
        timed(fn, items)  # warm-up
    now7 = {f"j{j}": Placement(j, "1g.5gb") for j in range(7)}
    rows = {
        "7 jobs, jobs only": timed(opt.solve, c7),
        "7 jobs running, moved": timed(lambda s: opt.solve(s, current=now7), c7),
        "4 jobs, jobs only": timed(opt.solve, c4),
        "4 jobs + 3 replicas": timed(lambda s: solve_beside_replicas(opt, s, reps), c4),
        "4 jobs beside 3 replicas": timed(free.solve, c4),
    }
    base = statistics.median(rows["7 jobs, jobs only"])
    # the restart-aware call miso+ makes has running jobs; compare like with like too
    run7 = statistics.median(rows["7 jobs running, moved"])
    for k, v in rows.items():
        v.sort()
        med = statistics.median(v)
        print(f"{k:24s} median {med:8.1f} us  p99 {v[int(0.99 * (len(v) - 1))]:8.1f} us  "
              f"vs 7 jobs {med / base:.2f}x, vs 7 running {med / run7:.2f}x")


if __name__ == "__main__":
    main()
