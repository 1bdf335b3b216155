"""Planning inference services: replicas that cover each service's rate at its SLO.

Pure (no I/O). :class:`ServicePlanner` folds service events and answers
:class:`~miso.sched.services.StartReplica` / :class:`~miso.sched.services.DrainReplica`
decisions, each with a ``why``. The rules:

* **Covering**: every service's non-draining replicas together cover its target: its plan
  rate x (1 + headroom), or its forecast when higher (:mod:`miso.sched.servicerate`: the
  smoothed, last and recent-peak rates, and a rising trend that stands out of the noise times
  the time a new replica needs), each replica counted at its capacity at the SLO
  (:func:`miso.serving.catalog.capacity_rps`, or a capacity measured live).
* **Cheapest covering**: the multiset of profiles with the fewest compute slices (then fewest
  replicas) whose capacities sum to the target, from ``min_replicas`` to ``max_replicas``.
* **Spreading**: a service with >= 2 replicas spans >= 2 GPUs (one GPU's repartition never
  takes the whole service down); replicas go first-fit onto GPUs that already host service
  slices (packing keeps whole GPUs free for training), a fresh GPU last; with a
  ``slot_cost`` (the training a slot stops) the cheapest slot of a tier wins (the slots:
  :mod:`miso.sched.serviceslots`).
* **Scale out** by the cheapest covering of the shortfall, or, when the cheapest covering of
  the whole target takes fewer slices than the live replicas plus that top-up, by a
  make-before-break resize to it (no piecemeal 7g + 4 x 3g where 2 x 7g cover).
* **Scale in with hysteresis**: only when the cheapest covering of target x (1 +
  ``hysteresis``) takes fewer compute slices than the live replicas, continuously for
  ``scale_in_delay_s``, and never within ``cooldown_s`` of a scale-out. Then that covering's
  missing replicas start and the surplus replicas retire (this also right-sizes a service
  whose replicas grew piecemeal).
* **Make-before-break**: a retiring replica is drained only once the ready, non-retiring
  replicas cover the target without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from miso.mig import Geometry, Placement
from miso.sched import servicerate
from miso.sched.servicecover import cheapest_covering
from miso.sched.servicerate import PlanRate
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
from miso.sched.servicescale import ScalingSteps
from miso.sched.serviceslots import ReplicaSlots
from miso.serving import catalog

CapacityFn = Callable[[ServiceSpec, str, str], float]


def catalogue_capacity(spec: ServiceSpec, gpu_model: str, profile: str) -> float:
    """A replica's capacity (req/s) from the catalogue's latency model."""
    return catalog.capacity_rps(spec.model, gpu_model, profile, spec.slo_p99_ms, spec.percentile)


@dataclass
class ReplicaState:
    """One replica as the planner sees it."""

    id: str
    gpu: str
    slot: Placement
    capacity: float
    ready: bool = False
    retiring: bool = False
    draining: bool = False


@dataclass
class ServiceState:
    """A service's rate signal (the fields of :class:`~miso.sched.servicerate.RateSignal`)
    and replicas."""

    spec: ServiceSpec
    ewma: float = 0.0
    last: float = 0.0
    history: list[tuple[float, float]] = field(default_factory=list)
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    next_id: int = 0
    over_since: float | None = None
    last_out: float = -math.inf
    stopped: bool = False

    def live(self) -> list[ReplicaState]:
        """Replicas that count for covering (not draining, not retiring)."""
        return [r for r in self.replicas.values() if not r.draining and not r.retiring]

    def covered(self) -> float:
        return sum(r.capacity for r in self.live())


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of :class:`ServicePlanner` (defaults used by the benchmarks)."""

    window_s: float = 30.0
    ewma_alpha: float = 0.4
    trend_points: int = 4
    hysteresis: float = 0.1
    scale_in_delay_s: float = 60.0
    cooldown_s: float = 60.0
    #: bursts: the plan rate is at least the highest rate observed this long back
    lookback_s: float = 90.0
    #: the trend adds at most this fraction of the observed rate (a burst's slope is no
    #: forecast)
    max_trend_boost: float = 0.25
    #: the trend counts only when its slope's t statistic (slope / standard error over the
    #: last ``trend_points``) reaches this: a flat, noisy rate gets no boost
    trend_t: float = 2.0


class ServicePlanner(ScalingSteps):
    """Decides service replicas on a set of GPUs (ids -> GPU model names); the scaling
    steps are its base, :class:`~miso.sched.servicescale.ScalingSteps`."""

    def __init__(self, gpus: Mapping[str, str], config: PlannerConfig | None = None,
                 capacity: CapacityFn = catalogue_capacity) -> None:
        self.cfg = config or PlannerConfig()
        self.capacity_fn = capacity
        self.slots = ReplicaSlots(gpus)
        self.services: dict[str, ServiceState] = {}
        self.measured: dict[tuple[str, str, str], float] = {}

    @property
    def gpus(self) -> dict[str, Geometry]:
        return self.slots.gpus

    @property
    def blocked(self) -> set[str]:
        """GPUs the planner must not use (:attr:`ReplicaSlots.blocked`)."""
        return self.slots.blocked

    @blocked.setter
    def blocked(self, gpus: set[str]) -> None:
        self.slots.blocked = gpus

    @property
    def slot_cost(self) -> Callable[[str, Placement], float] | None:
        """The price of a slot (:attr:`ReplicaSlots.slot_cost`)."""
        return self.slots.slot_cost

    @slot_cost.setter
    def slot_cost(self, fn: Callable[[str, Placement], float] | None) -> None:
        self.slots.slot_cost = fn


    # -- the cluster's GPUs -----------------------------------------------------------------
    def add_gpu(self, gpu: str, model: str) -> None:
        """A GPU joined the cluster (no-op when known)."""
        self.slots.add_gpu(gpu, model)

    def remove_gpu(self, gpu: str) -> list[tuple[str, str]]:
        """A GPU left: its replicas are gone (returned as (service, replica)); their services
        are short until the next plan."""
        lost = self.slots.remove_gpu(gpu)
        for svc, rid in lost:
            s = self.services.get(svc)
            if s is not None:
                s.replicas.pop(rid, None)
        return lost

    def replan(self, now: float, service: str, trigger: str = "replan"
               ) -> list[StartReplica | DrainReplica]:
        """Plan ``service`` again (e.g. after it lost replicas with a GPU)."""
        s = self.services.get(service)
        if s is None or s.stopped:
            return []
        return self._plan(now, s, trigger)

    # -- capacities -------------------------------------------------------------------------
    def cap(self, spec: ServiceSpec, gpu_model: str, profile: str) -> float:
        got = self.measured.get((spec.name, gpu_model, profile))
        return got if got is not None else self.capacity_fn(spec, gpu_model, profile)

    def options(self, spec: ServiceSpec) -> list[tuple[str, float, int]]:
        """(profile, capacity, compute slices) of each profile that can serve ``spec`` on the
        cluster's (first) GPU model, smallest first."""
        geom = next(iter(self.gpus.values()))
        out = []
        for p in geom.profiles:
            c = self.cap(spec, geom.model.name, p.name)
            if c > 0:
                out.append((p.name, c, p.compute_slices))
        return sorted(out, key=lambda o: (o[2], -o[1]))

    # -- the rate signal (:mod:`miso.sched.servicerate`) ----------------------------------
    def rates(self, s: ServiceState) -> PlanRate:
        """The rate ``s`` is planned for: base, the trend's boost and the slope."""
        return servicerate.plan_rate(s, catalog.load_time_s(s.spec.model), self.cfg)

    def plan_rate(self, s: ServiceState) -> tuple[float, float]:
        """(forecast rate: base + trend boost, trend in req/s per s)."""
        p = self.rates(s)
        return p.forecast, p.slope

    def target(self, s: ServiceState) -> float:
        """The rate the live replicas must cover (:func:`miso.sched.servicerate.target`)."""
        return servicerate.target(self.rates(s), s.spec.headroom)

    # -- covering ---------------------------------------------------------------------------
    def cheapest(self, spec: ServiceSpec, need: float, at_least: int, at_most: int
                 ) -> list[str] | None:
        """Fewest compute slices (then fewest replicas) of profiles covering ``need`` with a
        replica count in [at_least, at_most]; None if no count covers it
        (:func:`miso.sched.servicecover.cheapest_covering`)."""
        return cheapest_covering(self.options(spec), need, at_least, at_most)

    # -- placement (:mod:`miso.sched.serviceslots`) ----------------------------------------
    def start_for(self, now: float, s: ServiceState, profile: str, why: dict
                  ) -> StartReplica | None:
        """Place one replica of ``profile`` for ``s`` (None: no room); the scaling steps
        call it."""
        own = {r.gpu for r in s.live()}
        avoid = own if len(own) < 2 else set()  # spread over two GPUs, then pack
        spot = self.slots.place(profile, avoid)
        if spot is None:
            return None
        gpu, slot = spot
        rid = f"{s.spec.name}-r{s.next_id}"
        s.next_id += 1
        cap = self.cap(s.spec, self.gpus[gpu].model.name, profile)
        s.replicas[rid] = ReplicaState(rid, gpu, slot, cap)
        self.slots.hold(gpu, s.spec.name, rid, slot)
        return StartReplica(s.spec.name, rid, gpu, slot, why=dict(why, gpu=gpu,
                                                                   slot=str(slot),
                                                                   capacity_rps=round(cap, 2)))

    def register(self, spec: ServiceSpec) -> ServiceState:
        """Know ``spec`` without planning it (static baselines place replicas themselves)."""
        self.services[spec.name] = ServiceState(spec)
        return self.services[spec.name]

    def start_replica(self, now: float, service: str, profile: str, why: dict
                      ) -> StartReplica | None:
        """Place one replica of ``profile`` for ``service`` (None: no room)."""
        return self.start_for(now, self.services[service], profile, why)

    # -- events -----------------------------------------------------------------------------
    def observe(self, now: float, ev: object) -> list[StartReplica | DrainReplica]:
        """Fold ``ev``; answer the decisions it calls for."""
        match ev:
            case ServiceSubmitted(service=spec):
                return self._on_submitted(now, spec)
            case ServiceRateObserved(name=name, rate_rps=rate):
                return self._on_rate(now, name, rate)
            case ReplicaReady(service=name, replica=rid):
                return self._on_ready(now, name, rid)
            case ReplicaDrained(service=name, replica=rid):
                return self._on_drained(name, rid)
            case ServiceStopped(name=name):
                return self._on_stopped(name)
            case ServiceCapacityObserved(service=name, gpu_model=gm, profile=p, capacity_rps=c):
                return self._on_capacity(now, name, gm, p, c)
        return []

    def _on_submitted(self, now: float, spec: ServiceSpec) -> list[StartReplica | DrainReplica]:
        """A new (or restarted) service: plan its first replicas; a running one is ignored."""
        if spec.name in self.services and not self.services[spec.name].stopped:
            return []
        self.services[spec.name] = ServiceState(spec)
        return self._plan(now, self.services[spec.name], "submitted")

    def _on_rate(self, now: float, name: str, rate: float) -> list[StartReplica | DrainReplica]:
        """A rate observation: fold it into the rate signal, then replan."""
        s = self.services.get(name)
        if s is None or s.stopped:
            return []
        servicerate.record_rate(s, now, max(0.0, float(rate)), self.cfg)
        return self._plan(now, s, "rate")

    def _on_ready(self, now: float, name: str, rid: str) -> list[StartReplica | DrainReplica]:
        """A replica serves: it now counts as ready (retiring ones may drain)."""
        s = self.services.get(name)
        if s is None or rid not in s.replicas:
            return []
        s.replicas[rid].ready = True
        return [] if s.stopped else self._plan(now, s, "replica_ready")

    def _on_drained(self, name: str, rid: str) -> list[StartReplica | DrainReplica]:
        """A replica is gone: forget it and free its slot."""
        s = self.services.get(name)
        if s is None or rid not in s.replicas:
            return []
        r = s.replicas.pop(rid)
        self.slots.release(r.gpu, rid)
        return []

    def _on_stopped(self, name: str) -> list[StartReplica | DrainReplica]:
        """A stopped service drains every replica not yet draining."""
        s = self.services.get(name)
        if s is None or s.stopped:
            return []
        s.stopped = True
        out: list[StartReplica | DrainReplica] = []
        for r in s.replicas.values():
            if not r.draining:
                r.draining = True
                out.append(DrainReplica(name, r.id, why={"reason": "service stopped"}))
        return out

    def _on_capacity(self, now: float, name: str, gpu_model: str, profile: str,
                     capacity_rps: float) -> list[StartReplica | DrainReplica]:
        """A capacity measured live replaces the catalogue's for that (GPU model, profile)."""
        s = self.services.get(name)
        if s is None:
            return []
        self.measured[(name, gpu_model, profile)] = max(0.0, float(capacity_rps))
        for r in s.replicas.values():
            if r.slot.profile == profile and self.gpus[r.gpu].model.name == gpu_model:
                r.capacity = self.measured[(name, gpu_model, profile)]
        return [] if s.stopped else self._plan(now, s, "capacity_measured")

    # -- views ------------------------------------------------------------------------------
    def gpus_in_use(self) -> list[str]:
        """GPUs holding at least one service slice."""
        return self.slots.gpus_in_use()

    def slices_in_use(self, gpu: str) -> int:
        return self.slots.slices_in_use(gpu)


def spread_ok(replicas: Sequence[ReplicaState]) -> bool:
    """A service with >= 2 replicas spans >= 2 GPUs."""
    live = [r for r in replicas if not r.draining]
    return len(live) < 2 or len({r.gpu for r in live}) >= 2
