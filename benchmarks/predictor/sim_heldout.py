"""miso+ with a predictor that never saw the job's model family vs with true speeds (issue 19).

usage: PYTHONPATH=src python benchmarks/predictor/sim_heldout.py [--seeds 5] [--quick]

1,000 Poisson jobs, 60 s mean inter-arrival, in the paper setting (40 GPUs, restart 30 s,
benchmarks/README.md "Paper setting") and the saturated one (16 GPUs, restart 60 s). miso+'s
mean average JCT over the seeds, and its ratio to miso+ with true speeds (worst seed too), for:
``true``; ``noisy`` (the paper's Gaussian error); ``heldout`` (every family new); ``heldout:F``
(only family F new); each with profiles taken on the cluster (miso+'s own rule: most newcomers
are planned with the catalogue prior) and ``--profiled-at-submit`` (every job planned with its
estimate from the start); then, profiled at submit, held-out errors scaled x2 / x3 and the
two robust switches of miso+ (:mod:`miso.sched.robust`).

The MISO trace holds 5 of the 8 families (no bert, cyclegan, deepspeech2), so the per-family
rows run on a family trace: the same arrivals and durations, with each job's workload replaced,
with probability 1/2, by one of family F's catalogue workloads (drawn per job and seed); its
"true" baseline is miso+ with true speeds on that same trace.
"""

from __future__ import annotations

import argparse
import zlib
from dataclasses import replace

import numpy as np

from miso.sched.experiments import PropagateObserved, RobustRisk
from miso.sim.engine import Simulator
from miso.sim.heldout import families
from miso.sim.metrics import summarize
from miso.sim.run import build_policy
from miso.sim.traces import TraceJob, poisson_jobs
from miso.sim.world import WorldConfig
from miso.workloads import catalogue, family_of

SETTINGS = {"40 GPUs, restart 30 s (paper)": (40, 30.0), "16 GPUs, restart 60 s (saturated)":
            (16, 60.0)}


def family_trace(jobs: list[TraceJob], family: str, seed: int) -> list[TraceJob]:
    """``jobs`` with half their workloads (each job with probability 1/2) from ``family``."""
    wls = sorted(w for w in catalogue() if family_of(w) == family)
    rng = np.random.default_rng([seed, zlib.crc32(family.encode())])
    return [replace(j, workload=wls[int(rng.integers(len(wls)))]) if rng.random() < 0.5 else j
            for j in jobs]


def avg_jct(gpus: int, restart_s: float, seed: int, predictor: str, at_submit: bool = False,
            scale: float = 1.0, family: str | None = None, **policy: object) -> float:
    cfg = WorldConfig(n_gpus=gpus, predictor=predictor, restart_s=restart_s,
                      profiled_at_submit=at_submit, error_scale=scale)
    jobs = poisson_jobs(1000, seed=seed, mean_interarrival_s=60.0)
    if family is not None:
        jobs = family_trace(jobs, family, seed)
    pol = build_policy("miso+", jobs, cfg, seed, **policy)
    return float(summarize(Simulator(pol, jobs, cfg, seed=seed).run())["avg_jct_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="no per-family rows")
    args = ap.parse_args()
    seeds = range(1, args.seeds + 1)
    rows: list[tuple[str, dict]] = [("noisy (paper)", {"predictor": "noisy"}),
                                    ("heldout (all families)", {"predictor": "heldout"})]
    extra = [("heldout, errors x2", {"predictor": "heldout", "scale": 2.0}),
             ("heldout, errors x3", {"predictor": "heldout", "scale": 3.0}),
             ("heldout, robust_risk 0.5", {"predictor": "heldout",
                                           "estimates": (RobustRisk(0.5),)}),
             ("heldout, propagate_observed", {"predictor": "heldout",
                                              "estimates": (PropagateObserved(),)}),
             ("heldout x2, robust_risk 0.5", {"predictor": "heldout", "scale": 2.0,
                                              "estimates": (RobustRisk(0.5),)}),
             ("heldout x2, propagate_observed", {"predictor": "heldout", "scale": 2.0,
                                                 "estimates": (PropagateObserved(),)})]
    for name, (gpus, restart) in SETTINGS.items():
        true = [avg_jct(gpus, restart, s, "true") for s in seeds]
        print(f"\n{name}: miso+ with true speeds {np.mean(true):.0f} s\n")
        print("| estimates | profiled on the cluster | ratio | worst seed | profiled at submit | "
              "ratio | worst seed |")
        print("|---|---|---|---|---|---|---|")
        for label, kw in rows:
            print(f"| {label} | {both(gpus, restart, seeds, true, kw)} |", flush=True)
        for label, kw in extra:
            v = [avg_jct(gpus, restart, s, at_submit=True, **kw) for s in seeds]
            worst = max(a / b for a, b in zip(v, true, strict=True))
            print(f"| {label} | - | - | - | {np.mean(v):.0f} | {np.mean(v) / np.mean(true):.3f} "
                  f"| {worst:.3f} |", flush=True)
        if args.quick:
            continue
        print(f"\n{name}, family traces (half the jobs of family F; ratio to true speeds on "
              "the same trace):\n")
        print("| family F | true s | estimates | profiled on the cluster | ratio | worst seed | "
              "profiled at submit | ratio | worst seed |")
        print("|---|---|---|---|---|---|---|---|---|")
        for f in families():
            ft = [avg_jct(gpus, restart, s, "true", family=f) for s in seeds]
            for label, pred in ((f"heldout:{f}", f"heldout:{f}"), ("heldout", "heldout")):
                cells = both(gpus, restart, seeds, ft, {"predictor": pred, "family": f})
                print(f"| {f} | {np.mean(ft):.0f} | {label} | {cells} |", flush=True)


def both(gpus: int, restart: float, seeds: range, true: list[float], kw: dict) -> str:
    """Cells for profiles taken on the cluster and at submission: mean, ratio, worst seed."""
    cells = []
    for at in (False, True):
        v = [avg_jct(gpus, restart, s, at_submit=at, **kw) for s in seeds]
        worst = max(a / b for a, b in zip(v, true, strict=True))
        cells.append(f"{np.mean(v):.0f} | {np.mean(v) / np.mean(true):.3f} | {worst:.3f}")
    return " | ".join(cells)

if __name__ == "__main__":
    main()
