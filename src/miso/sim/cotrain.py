"""Training jobs on the GPUs services leave: the training simulator with GPUs taken and given
back over time.

For the baselines (and training policies without a per-GPU optimizer) services are planned
first (:mod:`miso.sim.servicesim`); a GPU that holds at least one service slice is taken from
training for that interval (``GpuRemoved``: its jobs are checkpointed and requeued, paying the
restart) and given back when its last replica is gone (``GpuAdded``): training does not use
the free slices of a GPU that hosts a replica. miso+'s services run with the training through
the scheduling core instead (:mod:`miso.sim.servicecluster`), training packing those slices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from miso.sched import GpuAdded, GpuRemoved
from miso.sim.bodies import EXTERNAL, SimGpu
from miso.sim.engine import Simulator
from miso.sim.result import SimResult
from miso.sim.run import build_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


class SharedClusterSimulator(Simulator):
    """:class:`~miso.sim.engine.Simulator` whose GPUs services take and give back."""

    def __init__(self, policy: Any, jobs: Sequence[TraceJob], config: WorldConfig,
                 taken: Mapping[str, Sequence[tuple[float, float]]], **kw: Any) -> None:
        super().__init__(policy, jobs, config, **kw)
        for gpu, intervals in taken.items():
            if gpu not in self.gpus:
                raise ValueError(f"services hold unknown GPU {gpu}")
            for a, b in intervals:
                self.push(max(0.0, a), EXTERNAL, GpuRemoved(gpu))
                if math.isfinite(b):
                    self.push(b, EXTERNAL, GpuAdded(gpu, config.gpu_model))

    def outside_event(self, now: float, ev: Any) -> None:
        if isinstance(ev, GpuAdded):
            old = self.gpus[ev.gpu]
            fresh = SimGpu(ev.gpu, self.geom)
            fresh.busy_total = old.busy_total
            self.gpus[ev.gpu] = fresh
            self.deliver(now, ev)
            return
        super().outside_event(now, ev)


def run_training(policy: str, jobs: Sequence[TraceJob], cfg: WorldConfig,
                 taken: Mapping[str, Sequence[tuple[float, float]]] | None = None,
                 seed: int = 1) -> SimResult:
    """Simulate ``policy`` on ``jobs`` with the GPUs in ``taken`` held by services."""
    pol = build_policy(policy, jobs, cfg, seed)
    return SharedClusterSimulator(pol, jobs, cfg, taken or {}, seed=seed).run()


#: training policies that pack the slices beside replicas (MIG policies with a per-GPU
#: optimizer): with them ``miso+`` services run through the core with training
#: (:mod:`miso.sim.servicecluster`); with the others the services' GPUs are taken whole
SHARED_POLICIES = ("miso+", "miso", "oracle")


def services_report(services: Sequence[Any], gpu_model: str, n_gpus: int,
                    jobs: Sequence[TraceJob], cfg: WorldConfig, seed: int = 1,
                    window_s: float = 30.0, policy: str = "miso+") -> dict[str, Any]:
    """Per service strategy: every service's figures (attainment overall and per minute,
    p50/p99, dropped, slice-hours, resizes) and the training jobs' average JCT under
    ``policy`` on the GPUs the services leave (``miso simulate --services``)."""
    import numpy as np

    from miso.sim.servicesim import STRATEGIES, run_strategy

    gpus = {f"gpu{i}": gpu_model for i in range(n_gpus)}
    out: dict[str, Any] = {}
    span = max(tr.duration_s for _, tr in services)
    for strat in STRATEGIES:
        jct: float | None
        if strat == "miso+" and policy in SHARED_POLICIES:
            # one run through the core: replicas first, training in the slices they leave
            from miso.sim.servicecluster import run_shared

            run, res = run_shared(services, jobs, cfg, span, policy, seed, window_s)
            jct = round(float(np.mean(res.jct)), 1)
        else:
            run = run_strategy(strat, services, gpus, window_s=window_s, seed=seed)
            try:
                res = run_training(policy, jobs, cfg, run.gpu_intervals(), seed=seed)
                jct = round(float(np.mean(res.jct)), 1)
            except RuntimeError:  # the services keep every GPU: training never finishes
                jct = None
        out[strat] = {
            "attainment_min": round(run.attainment_min, 6), "dropped": run.dropped,
            "slice_hours": round(run.slice_hours, 4),
            "gpus_held_mean": round(run.mean_gpus_held(), 3),
            "training_avg_jct_s": jct,
            "services": {n: o.to_json() for n, o in run.outcomes.items()},
            "decisions": [{"t": round(t, 1), "decision": type(d).__name__,
                           "replica": d.replica, "why": (d.why or {}).get("note", "")}
                          for t, d in run.log],
        }
    return out
