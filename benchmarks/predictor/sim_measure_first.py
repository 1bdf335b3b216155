"""Where miso+ loses against true speeds when profiles are taken on the cluster, and what a
live system could do about it (issue 19, item 5; benchmarks/README.md "Predictor, third pass").

usage: PYTHONPATH=src python benchmarks/predictor/sim_measure_first.py [--seeds 5]

Same runs as ``sim_heldout.py`` (1,000 Poisson jobs, 60 s mean inter-arrival, miso+ with the
held-out-family predictor, ratio of the mean average JCT to miso+ with true speeds, worst seed
too), in the paper setting (40 GPUs, restart 30 s) and the saturated one (16 GPUs, 60 s):

* live variants (miso+ switches): ``cluster_prior`` (unprofiled jobs planned with this
  cluster's estimates, :mod:`miso.sched.clusterprior`), ``anchor_slices`` (a job with an
  estimate but no full-GPU rate anchors one on its first slice), ``profile_when="always"``;
* diagnostics no live system has (they read the trace's workload): unprofiled jobs planned
  with their true speeds from the start ("oracle prior"), or only once they have run on two
  slices ("oracle after 2 slices");
* a profiling GPU: every job profiled (two 10 s MPS levels and a restart) before it reaches
  the cluster, planned with its estimate from the start (``profiled_at_submit``), its start
  delayed by the profiling and one restart added to its work; the profiling GPU taken from
  the cluster, or added to it.
"""

from __future__ import annotations

import argparse
import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from sim_heldout import avg_jct  # noqa: E402

from miso.sched.policies.misoplus import MisoPlus  # noqa: E402
from miso.sched.speeds import workload_speeds  # noqa: E402
from miso.sim.engine import Simulator  # noqa: E402
from miso.sim.metrics import summarize  # noqa: E402
from miso.sim.run import build_policy  # noqa: E402
from miso.sim.traces import poisson_jobs  # noqa: E402
from miso.sim.world import WorldConfig  # noqa: E402
from miso.workloads import catalogue  # noqa: E402

SETTINGS = {"40 GPUs, restart 30 s (paper)": (40, 30.0),
            "16 GPUs, restart 60 s (saturated)": (16, 60.0)}
PROFILE_S = 10.0   # miso+'s seconds per MPS level


def oracle_speeds(min_slices: int):  # noqa: ANN201 - a method for types.MethodType
    """``MisoPlus.speeds`` with every job not profiled given its true speeds once it has run
    on ``min_slices`` slices (0: from the start). A diagnostic: it reads the workload."""
    def speeds(self, geom, sc, jobs):  # noqa: ANN001, ANN202
        out = MisoPlus.speeds(self, geom, sc, jobs)
        for j in jobs:
            js = sc.state.jobs[j]
            if j in self.est or len(js.observed) < min_slices:
                continue
            truth = workload_speeds(geom, catalogue()[js.spec.workload])
            out[j] = {p: truth.get(p, v) for p, v in out[j].items()}
        return out
    return speeds


def run(gpus: int, restart: float, seed: int, oracle: int | None = None,
        profiling_gpu: int | None = None, **policy: object) -> float:
    """miso+'s average JCT with the held-out predictor (see the module docstring)."""
    if oracle is None and profiling_gpu is None:
        return avg_jct(gpus, restart, seed, "heldout", **policy)
    jobs = poisson_jobs(1000, seed=seed, mean_interarrival_s=60.0)
    delay = 0.0
    cfg = WorldConfig(n_gpus=gpus, predictor="heldout", restart_s=restart)
    if profiling_gpu is not None:
        delay = 2 * PROFILE_S + restart
        jobs = [replace(j, submit_s=j.submit_s + delay, duration_s=j.duration_s + restart)
                for j in jobs]
        cfg = replace(cfg, n_gpus=gpus - profiling_gpu, profiled_at_submit=True)
    pol = build_policy("miso+", jobs, cfg, seed, **policy)
    if oracle is not None:
        pol.speeds = types.MethodType(oracle_speeds(oracle), pol)
    return float(summarize(Simulator(pol, jobs, cfg, seed=seed).run())["avg_jct_s"]) + delay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    seeds = range(1, args.seeds + 1)
    rows: list[tuple[str, dict]] = [
        ("heldout, profiled on the cluster (miso+ default)", {}),
        ("+ cluster_prior", {"cluster_prior": True}),
        ("+ anchor_slices", {"anchor_slices": True}),
        ('+ profile_when="always"', {"profile_when": "always"}),
        ("profiled at submit", {"at_submit": True}),
        ("profiled at submit + anchor_slices", {"at_submit": True, "anchor_slices": True}),
        ("diagnostic: oracle prior", {"oracle": 0}),
        ("diagnostic: oracle after 2 slices", {"oracle": 2}),
        ("profiling GPU taken from the cluster", {"profiling_gpu": 1}),
        ("profiling GPU added to the cluster", {"profiling_gpu": 0}),
    ]
    for name, (gpus, restart) in SETTINGS.items():
        true = [avg_jct(gpus, restart, s, "true") for s in seeds]
        print(f"\n{name}: miso+ with true speeds {np.mean(true):.0f} s\n")
        print("| variant | avg JCT s | ratio | worst seed |")
        print("|---|---|---|---|")
        for label, kw in rows:
            v = [run(gpus, restart, s, **kw) for s in seeds]
            worst = max(a / b for a, b in zip(v, true, strict=True))
            print(f"| {label} | {np.mean(v):.0f} | {np.mean(v) / np.mean(true):.3f} | "
                  f"{worst:.3f} |", flush=True)


if __name__ == "__main__":
    main()
