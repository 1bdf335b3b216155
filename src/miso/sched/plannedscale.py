"""How many replicas a live service needs: the scheduling core's planner, fed live signals.

:class:`PlannedScaler` drives :class:`miso.sched.serviceplan.ServicePlanner` (the planner the
simulator uses) through its public events: the router's rate (``ServiceRateObserved``),
replicas that got ready (``ReplicaReady``) or are gone (``ReplicaDrained``), and the capacity of
one replica on the slice replicas actually get (``ServiceCapacityObserved``). Its decisions
(``StartReplica`` / ``DrainReplica``, each with its ``why``) are what the service manager does:
start a replica job, drain one. So the live service scales by the same rules as the simulated
one: plan rate (EWMA, recent peak, rising trend), cheapest covering at the SLO, scale-in only
after the service stayed oversized for ``scale_in_delay_s`` and not within ``cooldown_s`` of a
scale-out, make-before-break.

What the live side cannot do yet: put a replica on a slice size of the planner's choosing (the
controller's policy places a replica like any job; the core has no profile pin). So the
planner plans in one replica *kind*, :data:`REPLICA_PROFILE` on virtual GPUs (one per
possible replica, so placement never fails), whose capacity is the live one: that of the
replica slice replicas get here, measured or from the model. The planner's slots and GPUs are
not used; the controller's policy places the jobs.

It is pure (no I/O) and drives only the core's planner, so it lives in ``miso.sched``: the
live service manager (:mod:`miso.controller.servicescale`) and the simulated replay of a live
run (:mod:`miso.sim.servicereplay`) both drive the planner through it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from miso.sched.serviceplan import PlannerConfig, ServicePlanner
from miso.sched.services import (
    DrainReplica,
    ReplicaDrained,
    ReplicaReady,
    ServiceCapacityObserved,
    ServiceRateObserved,
    ServiceSpec,
    ServiceStopped,
    ServiceSubmitted,
    StartReplica,
)

#: The one profile the planner plans in (see the module docstring).
REPLICA_PROFILE = "7g.40gb"
GPU_MODEL = "A100-40GB"
#: The live defaults: a 10-s rate window observed every second; scale in after one window
#: (10 s) oversized, not within 20 s of a scale-out, the peak of the last window kept (the
#: simulator's are minutes: its rate signal is a 30-s window of a trace).
LIVE_CONFIG = PlannerConfig(window_s=10.0, ewma_alpha=0.3, trend_points=5, hysteresis=0.1,
                            scale_in_delay_s=10.0, cooldown_s=20.0, lookback_s=10.0,
                            max_trend_boost=0.25, trend_t=2.0)
#: Virtual GPUs: the most replicas a service may have (the API bounds max_replicas by 64).
MAX_VIRTUAL = 64


@dataclass
class PlannedScaler:
    """One :class:`ServicePlanner` for every live service (see the module docstring)."""

    config: PlannerConfig = LIVE_CONFIG
    planner: ServicePlanner = field(init=False)
    capacity: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.planner = ServicePlanner({f"v{i}": GPU_MODEL for i in range(MAX_VIRTUAL)},
                                      self.config, capacity=self._capacity)

    def _capacity(self, spec: ServiceSpec, gpu_model: str, profile: str) -> float:
        if profile != REPLICA_PROFILE:
            return 0.0
        return self.capacity.get(spec.name, 0.0)

    def submit(self, now: float, spec: ServiceSpec, capacity: float
               ) -> list[StartReplica | DrainReplica]:
        """A new service with a first estimate of one replica's capacity (req/s)."""
        self.capacity[spec.name] = max(1e-6, capacity)
        return self.planner.observe(now, ServiceSubmitted(spec))

    def known(self, name: str) -> bool:
        s = self.planner.services.get(name)
        return s is not None and not s.stopped

    def set_capacity(self, now: float, name: str, capacity: float
                     ) -> list[StartReplica | DrainReplica]:
        """One replica's capacity on the slice replicas get (measured live or modelled)."""
        if not math.isfinite(capacity) or capacity <= 0 or \
                abs(capacity - self.capacity.get(name, 0.0)) < 1e-9:
            return []
        self.capacity[name] = capacity
        return self.planner.observe(now, ServiceCapacityObserved(
            name, GPU_MODEL, REPLICA_PROFILE, capacity))

    def rate(self, now: float, name: str, rate_rps: float) -> list[StartReplica | DrainReplica]:
        return self.planner.observe(now, ServiceRateObserved(name, rate_rps))

    def ready(self, now: float, name: str, replica: str) -> list[StartReplica | DrainReplica]:
        return self.planner.observe(now, ReplicaReady(name, replica))

    def drained(self, now: float, name: str, replica: str) -> None:
        self.planner.observe(now, ReplicaDrained(name, replica))

    def stop(self, now: float, name: str) -> None:
        self.planner.observe(now, ServiceStopped(name))
        s = self.planner.services.get(name)
        for rid in list(s.replicas) if s is not None else []:
            self.planner.observe(now, ReplicaDrained(name, rid))

    def planned(self, name: str) -> int:
        """Replicas the planner counts as serving or starting (not draining, not retiring)."""
        s = self.planner.services.get(name)
        return len(s.live()) if s is not None else 0
