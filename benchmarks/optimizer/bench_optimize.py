"""Optimizer speed: median and p99 solve time for 1..7 jobs, and the ratio to brute force.

Run: python benchmarks/optimizer/bench_optimize.py [--gpu A100-40GB] [--cases 2000]
Both solvers see the same random cases in the same run; the process is pinned to one core.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from miso.bruteforce import brute_force
from miso.mig import geometry
from miso.optimize import optimizer_for


def cases(geom, n: int, count: int, rng: random.Random):
    names = [p.name for p in geom.profiles]
    out = []
    for _ in range(count):
        speeds = {}
        for j in range(n):
            # Realistic shape: speed grows with slice size; the smallest slices may not fit.
            base = sorted((rng.uniform(0.1, 1.0) for _ in names), reverse=True)
            row = dict(zip(names, base, strict=True))
            if j < geom.model.compute_slices - n and rng.random() < 0.3:
                row.pop(names[-1])
            speeds[f"j{j}"] = row
        out.append(speeds)
    return out


def timed(fn, items) -> list[float]:
    times = []
    for it in items:
        t0 = time.perf_counter_ns()
        fn(it)
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    return times


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", default="A100-40GB")
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--brute-cases", type=int, default=50)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    geom = geometry(args.gpu)
    t0 = time.perf_counter()
    opt = optimizer_for(geom)
    setup_ms = (time.perf_counter() - t0) * 1000
    rng = random.Random(0)
    print(f"{args.gpu}: precompute {setup_ms:.1f} ms (once per GPU model)")
    print("| jobs | median us | p99 us | brute-force median us | speed-up |")
    print("|---:|---:|---:|---:|---:|")
    for n in range(1, opt.max_jobs + 1):
        items = cases(geom, n, args.cases, rng)
        for it in items[:50]:  # warm-up
            opt.solve(it)
        fast = timed(opt.solve, items)
        brute = timed(lambda s: brute_force(geom, s), items[: args.brute_cases])
        fm, bm = statistics.median(fast), statistics.median(brute)
        print(f"| {n} | {fm:.1f} | {pct(fast, 0.99):.1f} | {bm:.0f} | {bm / fm:.0f}x |")


if __name__ == "__main__":
    main()
