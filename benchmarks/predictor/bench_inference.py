"""Inference latency of the shipped predictor: median over N calls for one mix.

usage: python benchmarks/predictor/bench_inference.py [--n 1000] [--model DIR]
Times ``Predictor.predict`` (raw speeds in, the public path) for 1..7-job mixes and the bare
numpy ensemble for one (3, 7) mix; prints medians and 90th percentiles in milliseconds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from miso.predict import Predictor
from miso.predict.evidence import JobEvidence


def timeit(f, n: int) -> tuple[float, float]:
    ts = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        f()
        ts[i] = time.perf_counter() - t0
    return float(np.median(ts) * 1e3), float(np.quantile(ts, 0.9) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    pred = Predictor.load(args.model)
    rng = np.random.default_rng(0)
    if pred.net is not None:
        print(f"U-Net members: {pred.net.k}; calls per figure: {args.n}")
        x7 = rng.uniform(0.2, 1.0, size=(1, 3, 7)).astype(np.float32)
        for _ in range(50):
            pred.net(x7)
        med, p90 = timeit(lambda: pred.net(x7), args.n)
        print(f"numpy ensemble, one (3, 7) mix: median {med:.3f} ms, p90 {p90:.3f} ms")
    else:
        print(f"per-job model, {pred.perjob.k} members; calls per figure: {args.n}")
        ev = [JobEvidence(mps={100: 10.0, 14: 3.0}, slices={4: 0.8}),
              JobEvidence(mps={100: 5.0, 14: 4.0})]
        med, p90 = timeit(lambda: pred.predict_jobs(ev), args.n)
        print(f"Predictor.predict_jobs, 2 jobs (100+14 %, one measured slice): median {med:.3f}"
              f" ms, p90 {p90:.3f} ms")
        ev = [JobEvidence(mps={100: 10.0, 14: 3.0}, slices={4: 0.8}, memory_gb=6.0),
              JobEvidence(mps={100: 5.0, 14: 4.0}, memory_gb=3.0)]
        med, p90 = timeit(lambda: pred.predict_jobs(ev), args.n)
        print(f"Predictor.predict_jobs, same with memory needs (memory regression too): median "
              f"{med:.3f} ms, p90 {p90:.3f} ms")
    for n_jobs in (1, 4, 7):
        s = rng.uniform(0.2, 1.0, size=(3, n_jobs))
        for _ in range(50):
            pred.predict(s)
        med, p90 = timeit(lambda s=s: pred.predict(s), args.n)
        print(f"Predictor.predict, {n_jobs}-job mix: median {med:.3f} ms, p90 {p90:.3f} ms")


if __name__ == "__main__":
    main()
