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


class ServicePlanner:
    """Decides service replicas on a set of GPUs (ids -> GPU model names)."""

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
    def _start(self, now: float, s: ServiceState, profile: str, why: dict) -> StartReplica | None:
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
        return self._start(now, self.services[service], profile, why)

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

    # -- the plan ---------------------------------------------------------------------------
    def _why(self, s: ServiceState, trigger: str, **kw: object) -> dict:
        p = self.rates(s)
        return dict(trigger=trigger, service=s.spec.name, rate_rps=round(s.last, 2),
                    smoothed_rps=round(s.ewma, 2), trend_rps_per_s=round(p.slope, 4),
                    target_rps=round(servicerate.target(p, s.spec.headroom), 2),
                    slo_ms=s.spec.slo_p99_ms, percentile=s.spec.percentile, **kw)

    def _plan(self, now: float, s: ServiceState, trigger: str
              ) -> list[StartReplica | DrainReplica]:
        """One planning step: scale out when short of the target, else consider scaling in;
        then drain the retiring replicas the ready ones no longer need."""
        target = self.target(s)
        covered = self._take_back_retiring(s, target)
        if self._short(s, target, covered):
            out = self._scale_out(now, s, target, covered, trigger)
        else:
            out = self._consider_scale_in(now, s, target, covered, trigger)
        out += self._drain_retired(now, s, trigger)
        return out

    @staticmethod
    def _short(s: ServiceState, target: float, covered: float) -> bool:
        """The live replicas fall short of the target rate or of ``min_replicas``."""
        return covered + 1e-9 < target or len(s.live()) < s.spec.min_replicas

    def _take_back_retiring(self, s: ServiceState, target: float) -> float:
        """The covering: what the live replicas cover. When short, retiring (not yet
        draining) replicas count again first (they need no load time) and any pending
        scale-in is called off."""
        covered = s.covered()
        if self._short(s, target, covered):
            s.over_since = None
            for r in s.replicas.values():
                if r.retiring and not r.draining and covered + 1e-9 < target:
                    r.retiring = False
                    covered += r.capacity
        return covered

    def _profiles_to_add(self, spec: ServiceSpec, need: float, n_live: int) -> list[str]:
        """Scale-out's profiles: the cheapest covering of ``need`` within the replica bounds,
        or, if none covers it within ``max_replicas``, the biggest allowed."""
        add = self.cheapest(spec, need, max(0, spec.min_replicas - n_live),
                            spec.max_replicas - n_live)
        if add is None:
            opts = self.options(spec)
            add = [max(opts, key=lambda o: o[1])[0]] * max(
                0, spec.max_replicas - n_live) if opts else []
        return add

    def _scale_out(self, now: float, s: ServiceState, target: float, covered: float,
                   trigger: str) -> list[StartReplica | DrainReplica]:
        """Scale-out: start the replicas that cover the shortfall, or, when the cheapest
        covering of the whole target takes fewer compute slices than the live replicas plus
        that top-up, resize to it make-before-break (replicas grown piecemeal, 7g + 4 x 3g,
        become 2 x 7g); starts the cooldown."""
        spec = s.spec
        live = s.live()
        add = self._profiles_to_add(spec, target - covered, len(live))
        if covered + 1e-9 < target and len(live) >= spec.min_replicas:
            whole = self.cheapest(spec, target, spec.min_replicas, spec.max_replicas)
            have = [r.slot.profile for r in live]
            if whole is not None and self._slices(spec, whole) < self._slices(spec, have + add):
                out = self._resize_to(now, s, whole, covered, trigger, "scale_out", (
                    f"scale out {spec.name}: target {target:.1f}/s > covered {covered:.1f}/s; "
                    f"resize to {'+'.join(whole)} (fewer slices than adding "
                    f"{'+'.join(add)}), new replicas before draining"))
                if out:
                    s.last_out = now
                    return out
                for r in live:  # no room for the resize: top up the replicas as they are
                    r.retiring = False
        out: list[StartReplica | DrainReplica] = []
        for prof in add:
            d = self._start(now, s, prof, self._why(
                s, trigger, action="scale_out", covered_rps=round(covered, 2),
                note=(f"scale out {spec.name}: target {target:.1f}/s > covered "
                      f"{covered:.1f}/s; add {prof}" if covered + 1e-9 < target else
                      f"start {spec.name}: {len(s.live())} live < min_replicas "
                      f"{spec.min_replicas}; add {prof}")))
            if d is not None:
                out.append(d)
                covered += s.replicas[d.replica].capacity
        if out:
            s.last_out = now
        return out

    def _consider_scale_in(self, now: float, s: ServiceState, target: float, covered: float,
                           trigger: str) -> list[StartReplica | DrainReplica]:
        """Scale-in with hysteresis: resize only after the service has been oversized
        (past the cooldown) for ``scale_in_delay_s`` without a break."""
        if now - s.last_out >= self.cfg.cooldown_s and self._oversized(s, target):
            if s.over_since is None:
                s.over_since = now
            elif now - s.over_since >= self.cfg.scale_in_delay_s:
                return self._scale_in(now, s, target, covered, trigger)
            return []
        s.over_since = None
        return []

    def _slices(self, spec: ServiceSpec, profiles: Sequence[str]) -> int:
        g_of = {p: g for p, _, g in self.options(spec)}
        return sum(g_of.get(p, 99) for p in profiles)

    def _oversized(self, s: ServiceState, target: float) -> bool:
        """The cheapest covering of target x (1 + hysteresis) takes fewer compute slices than
        the live replicas: a resize would save slices and still leave the margin."""
        spec = s.spec
        want = self.cheapest(spec, target * (1.0 + self.cfg.hysteresis), spec.min_replicas,
                             spec.max_replicas)
        if want is None:
            return False
        return self._slices(spec, want) < self._slices(spec, [r.slot.profile for r in s.live()])

    def _scale_in(self, now: float, s: ServiceState, target: float, covered: float,
                  trigger: str) -> list[StartReplica | DrainReplica]:
        spec = s.spec
        live = s.live()
        want = self.cheapest(spec, target * (1.0 + self.cfg.hysteresis), spec.min_replicas,
                             spec.max_replicas)
        if want is None or self._slices(spec, want) >= self._slices(
                spec, [r.slot.profile for r in live]):
            return []
        out = self._resize_to(now, s, want, covered, trigger, "resize", (
            f"resize {spec.name}: {covered:.1f}/s covered > target {target:.1f}/s x "
            f"{1 + self.cfg.hysteresis:g} for {self.cfg.scale_in_delay_s:g}s; start "
            f"{'+'.join(want)} before draining"))
        s.over_since = None
        return out

    def _resize_to(self, now: float, s: ServiceState, want: list[str], covered: float,
                   trigger: str, action: str, note: str) -> list[StartReplica | DrainReplica]:
        """Make-before-break resize to the covering ``want``: the live replicas it also uses
        stay (largest capacity first), the others retire (drained once the ready replicas
        cover the target: :meth:`_drain_retired`), its missing replicas start."""
        live = s.live()
        keep: list[ReplicaState] = []
        rest = list(want)
        for r in sorted(live, key=lambda r: -r.capacity):
            if r.slot.profile in rest:
                rest.remove(r.slot.profile)
                keep.append(r)
        if len(want) >= 2 and not rest and len({r.gpu for r in keep}) < 2:
            moved = keep.pop()  # keep the spread: its twin starts on another GPU
            rest.append(moved.slot.profile)
        out: list[StartReplica | DrainReplica] = []
        for r in live:
            if r not in keep:
                r.retiring = True
        for prof in rest:
            d = self._start(now, s, prof, self._why(
                s, trigger, action=action, covered_rps=round(covered, 2), note=note))
            if d is not None:
                out.append(d)
        return out

    def _drain_retired(self, now: float, s: ServiceState, trigger: str) -> list[DrainReplica]:
        """Drain retiring replicas once the ready live ones cover the target (make-before-break);
        if a retiring replica's replacement could not be placed, it is kept."""
        retiring = [r for r in s.replicas.values() if r.retiring and not r.draining]
        if not retiring:
            return []
        target = self.target(s)
        ready = sum(r.capacity for r in s.live() if r.ready)
        if ready + 1e-9 < target or len([r for r in s.live() if r.ready]) < s.spec.min_replicas:
            if s.covered() + 1e-9 < target:  # replacement could not be placed: keep them
                for r in retiring:
                    r.retiring = False
            return []
        out = []
        for r in retiring:
            r.draining = True
            out.append(DrainReplica(s.spec.name, r.id, why=self._why(
                s, trigger, action="drain", covered_rps=round(ready, 2),
                note=(f"drain {r.id} ({r.slot.profile} on {r.gpu}): ready replicas cover "
                      f"{ready:.1f}/s >= target {target:.1f}/s"))))
        return out

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
