"""Services and training in one simulated cluster, through the one scheduling core.

:class:`ServicesSimulator` is the training simulator (:class:`~miso.sim.engine.Simulator`)
whose policy is :class:`~miso.sched.servicepolicy.ServicesFirst`: every service's request
rate (the router's signal: the peak 10 s rate of each window) arrives as
``ServiceRateObserved`` events beside the training jobs' events, and the replicas the core
starts and drains are carried out here (a replica is ready after the MIG reconfiguration and
its model's load time; a drained one holds its slice until its in-flight requests are done).
Training runs in the slices the replicas leave free. The replicas' records are then served
request by request (:func:`miso.sim.servicesim.measure`).

Services run warm, as in :func:`miso.sim.servicesim.run_miso`: the last lookback of each
trace's window rates (the trace as a cycle) is observed at t = 0 and the replicas chosen for
it are ready at once (everything decided at t = 0 is warm: ready at once, and a replica
drained then has no request in flight).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from miso.sched.serviceplan import CapacityFn, PlannerConfig
from miso.sched.servicepolicy import ServicesFirst
from miso.sched.services import (
    SERVICE_EVENTS,
    DrainReplica,
    ReplicaDrained,
    ReplicaReady,
    ServiceRateObserved,
    ServiceSpec,
    ServiceSubmitted,
    StartReplica,
)
from miso.serving import catalog
from miso.serving.traces import RequestTrace
from miso.sim.bodies import EXTERNAL
from miso.sim.engine import Simulator
from miso.sim.result import SimResult
from miso.sim.run import build_policy
from miso.sim.servicesim import (
    ReplicaRecord,
    ServicesRun,
    calibrated_capacity,
    drain_time_s,
    measure,
    window_rates,
)
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


class ServicesSimulator(Simulator):
    """Training jobs and inference services on one cluster (see the module docstring)."""

    def __init__(self, policy: ServicesFirst, jobs: Sequence[TraceJob], config: WorldConfig,
                 services: Sequence[tuple[ServiceSpec, RequestTrace]], span_s: float,
                 window_s: float = 30.0, reconfig_s: float = 4.0, **kw: Any) -> None:
        super().__init__(policy, jobs, config, **kw)
        self.planner = policy.planner  # (self.policy may be a gang layer around it)
        self.specs = {s.name: s for s, _ in services}
        self.span_s = span_s
        self.reconfig_s = reconfig_s
        self.records: dict[str, ReplicaRecord] = {}
        self.service_log: list[tuple[float, object]] = []
        n = math.ceil(span_s / window_s)
        rates = {s.name: window_rates(tr, window_s, n) for s, tr in services}
        back = max(1, int(policy.planner.cfg.lookback_s // window_s))
        for s, _ in services:
            self.push(0.0, EXTERNAL, ServiceSubmitted(s))
            for r in rates[s.name][-back:]:
                self.push(0.0, EXTERNAL, ServiceRateObserved(s.name, float(r)))
        for k in range(1, n + 1):
            for s, _ in services:
                self.push(k * window_s, EXTERNAL,
                          ServiceRateObserved(s.name, float(rates[s.name][k - 1])))

    def outside_event(self, now: float, ev: Any) -> None:
        if isinstance(ev, SERVICE_EVENTS):
            self.deliver(now, ev)
            return
        super().outside_event(now, ev)

    def _execute(self, now: float, d: Any, gid: Any) -> None:
        if isinstance(d, StartReplica):
            spec = self.specs[d.service]
            ready = now if now <= 0.0 else now + self.reconfig_s + catalog.load_time_s(spec.model)
            cap = self.planner.services[d.service].replicas[d.replica].capacity
            slices = self.geom.model.profile(d.profile).compute_slices
            self.records[d.replica] = ReplicaRecord(d.service, d.replica, d.gpu, d.profile,
                                                    slices, cap, now, ready)
            self.service_log.append((now, d))
            self.push(ready, EXTERNAL, ReplicaReady(d.service, d.replica))
            return
        if isinstance(d, DrainReplica):
            r = self.records[d.replica]
            r.drain_s = now
            # drained while warming up (t = 0, before the first request): nothing in flight
            r.gone_s = now if now <= 0.0 else now + drain_time_s(self.specs[d.service])
            self.service_log.append((now, d))
            self.push(r.gone_s, EXTERNAL, ReplicaDrained(d.service, d.replica))
            return
        super()._execute(now, d, gid)

    def services_run(self) -> ServicesRun:
        """The replicas as :func:`~miso.sim.servicesim.measure` serves them."""
        return ServicesRun("miso+", self.span_s, list(self.records.values()),
                           list(self.service_log))


def run_shared(services: Sequence[tuple[ServiceSpec, RequestTrace]], jobs: Sequence[TraceJob],
               cfg: WorldConfig, span_s: float, policy: str = "miso+", seed: int = 1,
               window_s: float = 30.0, config: PlannerConfig | None = None,
               capacity: CapacityFn | None = None, observer: Any = None
               ) -> tuple[ServicesRun, SimResult]:
    """Services (miso+'s covering planner) and training (``policy``) in one run; the
    services measured request by request. ``observer``: the driver step's (``on_event``,
    ``on_decision``)."""
    cap = capacity or calibrated_capacity(services)
    pol = ServicesFirst(build_policy(policy, jobs, cfg, seed),
                        config or PlannerConfig(window_s=window_s), cap)
    sim = ServicesSimulator(pol, jobs, cfg, services, span_s, window_s, seed=seed,
                           observer=observer)
    res = sim.run()
    run = measure(sim.services_run(), services, cfg.gpu_model, seed)
    return run, res
