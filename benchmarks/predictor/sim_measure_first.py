"""Where miso+ loses against true speeds when profiles are taken on the cluster, and what a
live system could do about it (issue 19, item 5; benchmarks/README.md "Predictor, third pass").

usage: PYTHONPATH=src python benchmarks/predictor/sim_measure_first.py [--seeds 5] [--families]

Same runs as ``sim_heldout.py`` (1,000 Poisson jobs, 60 s mean inter-arrival, miso+ with the
held-out-family predictor, ratio of the mean average JCT to miso+ with true speeds, worst seed
too), in the paper setting (40 GPUs, restart 30 s) and the saturated one (16 GPUs, 60 s):

* live variants (miso+ switches): ``cluster_prior`` (unprofiled jobs planned with this
  cluster's estimates, :mod:`miso.sched.clusterprior`), ``anchor_slices`` (a job with an
  estimate but no full-GPU rate anchors one on its first slice), ``profile_when="always"``;
* diagnostics no live system has (they read the trace's workload): unprofiled jobs planned
  with their true speeds from the start ("oracle prior"), or only once they have run on two
  slices ("oracle after 2 slices");
* a profiling GPU: every job profiled (two 10 s MPS levels, a restart between them) before
  it reaches the cluster and planned with its estimate from the start
  (``profiled_at_submit``): its start is delayed by the profiling and the restart onto its
  GPU, its work shortened by the 10 s it ran alone at 100 %; the profiling GPU taken from the
  cluster, or added to it;
* "measure the full-GPU rate first": every job runs 10 s alone on a spare GPU (its full-GPU
  rate) and restarts on the cluster, where its first slice then reveals its speeds (a
  diagnostic: all its slices, not only the measured one, become true at the first slice, as
  an ideal one-slice predictor would make them); and without the oracle ("measured first,
  live"): only the full-GPU rate is given to miso+ (the rate the 10 s alone measured), so its
  first slice's rate becomes that slice's true speed through miso+'s own observed-rate path
  and its other slices keep the prior; the measuring GPU added to the cluster, or taken
  from it.

``--families``: instead, the paper setting on each family trace of ``sim_heldout.py`` (every
family new), miso+ as shipped, with ``cluster_prior``, and measured first (GPU added).
"""

from __future__ import annotations

import argparse
import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from sim_heldout import avg_jct, family_trace  # noqa: E402

from miso.sched.policies.misoplus import MisoPlus  # noqa: E402
from miso.sched.speeds import workload_speeds  # noqa: E402
from miso.sim.engine import Simulator  # noqa: E402
from miso.sim.heldout import families  # noqa: E402
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
        profiling_gpu: int | None = None, full_first: bool = False, measure_gpu: int | None = None,
        family: str | None = None, **policy: object) -> float:
    """miso+'s average JCT with the held-out predictor (see the module docstring)."""
    if measure_gpu is not None:
        full_first, gpus = True, gpus - measure_gpu
    if oracle is None and profiling_gpu is None and not full_first:
        return avg_jct(gpus, restart, seed, "heldout", family=family, **policy)
    jobs = poisson_jobs(1000, seed=seed, mean_interarrival_s=60.0)
    if family is not None:
        jobs = family_trace(jobs, family, seed)
    delay = 0.0
    cfg = WorldConfig(n_gpus=gpus, predictor="heldout", restart_s=restart)
    if profiling_gpu is not None or full_first:
        # wall time before it lands (levels and restarts), work done alone at 100 %
        delay = PROFILE_S + restart if full_first else 2 * PROFILE_S + 2 * restart
        jobs = [replace(j, submit_s=j.submit_s + delay,
                        duration_s=max(1.0, j.duration_s - PROFILE_S)) for j in jobs]
    if profiling_gpu is not None:
        cfg = replace(cfg, n_gpus=gpus - profiling_gpu, profiled_at_submit=True)
    pol = build_policy("miso+", jobs, cfg, seed, **policy)
    if oracle is not None:
        pol.speeds = types.MethodType(oracle_speeds(oracle), pol)
    sim = Simulator(pol, jobs, cfg, seed=seed)
    if measure_gpu is not None:
        def observed(self, now, ev, sc):  # noqa: ANN001, ANN202 - the measured full-GPU rate
            self.ref_rate.setdefault(ev.job, sim.jobs[ev.job].base_rate)
            return MisoPlus.on_speed_observed(self, now, ev, sc)
        pol.on_speed_observed = types.MethodType(observed, pol)
    return float(summarize(sim.run())["avg_jct_s"]) + delay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--families", action="store_true", help="cluster_prior per family trace")
    args = ap.parse_args()
    seeds = range(1, args.seeds + 1)
    if args.families:
        print("| family F (40 GPUs, restart 30 s) | true s | miso+ | ratio | worst seed | "
              "cluster_prior | ratio | worst seed | measured first (GPU added) | ratio | "
              "worst seed |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for f in families():
            true = [avg_jct(40, 30.0, s, "true", family=f) for s in seeds]
            cells = []
            for kw in ({}, {"cluster_prior": True}, {"measure_gpu": 0}):
                v = [run(40, 30.0, s, family=f, **kw) for s in seeds]
                worst = max(a / b for a, b in zip(v, true, strict=True))
                cells.append(f"{np.mean(v):.0f} | {np.mean(v) / np.mean(true):.3f} | "
                             f"{worst:.3f}")
            print(f"| {f} | {np.mean(true):.0f} | {' | '.join(cells)} |", flush=True)
        return
    rows: list[tuple[str, dict]] = [
        ("heldout, profiled on the cluster (miso+ default)", {}),
        ("+ cluster_prior", {"cluster_prior": True}),
        ("+ anchor_slices", {"anchor_slices": True}),
        ('+ profile_when="always"', {"profile_when": "always"}),
        ("profiled at submit", {"at_submit": True}),
        ("profiled at submit + anchor_slices", {"at_submit": True, "anchor_slices": True}),
        ("diagnostic: oracle prior", {"oracle": 0}),
        ("diagnostic: oracle after 2 slices", {"oracle": 2}),
        ("diagnostic: oracle at the first slice", {"oracle": 1}),
        ("diagnostic: full-GPU rate measured first, oracle at the first slice",
         {"oracle": 1, "full_first": True}),
        ("full-GPU rate measured first (live), measuring GPU added", {"measure_gpu": 0}),
        ("full-GPU rate measured first (live), measuring GPU taken from the cluster",
         {"measure_gpu": 1}),
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
