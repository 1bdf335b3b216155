"""Planning inference services: replicas that cover each service's rate at its SLO.

Pure (no I/O). :class:`ServicePlanner` folds service events and answers
:class:`~miso.sched.services.StartReplica` / :class:`~miso.sched.services.DrainReplica`
decisions, each with a ``why``. The rules:

* **Covering**: every service's non-draining replicas together cover its plan rate x
  (1 + headroom), each replica counted at its capacity at the SLO
  (:func:`miso.serving.catalog.capacity_rps`, or a capacity measured live).
* **Plan rate**: the largest of the smoothed rate (EWMA), the last observed rate and the peak
  observed over the last ``lookback_s`` (bursty services keep their burst capacity), plus the
  rising trend (least-squares slope of the last ``trend_points`` observations) times the time a
  new replica needs (load time + one window): scale out before the SLO is missed.
* **Cheapest covering**: the multiset of profiles with the fewest compute slices (then fewest
  replicas) whose capacities sum to the target, from ``min_replicas`` to ``max_replicas``.
* **Spreading**: a service with >= 2 replicas spans >= 2 GPUs (one GPU's repartition never
  takes the whole service down); replicas go first-fit onto GPUs that already host service
  slices (packing keeps whole GPUs free for training), a fresh GPU last.
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

from miso.mig import Geometry, Placement, geometry, is_valid
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
    """A service's rate signal and replicas."""

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
    hysteresis: float = 0.25
    scale_in_delay_s: float = 180.0
    cooldown_s: float = 120.0
    #: bursts: the plan rate is at least the highest rate observed this long back
    lookback_s: float = 180.0
    #: the trend adds at most this fraction of the observed rate (a burst's slope is no
    #: forecast)
    max_trend_boost: float = 0.25


class ServicePlanner:
    """Decides service replicas on a set of GPUs (ids -> GPU model names)."""

    def __init__(self, gpus: Mapping[str, str], config: PlannerConfig | None = None,
                 capacity: CapacityFn = catalogue_capacity) -> None:
        self.cfg = config or PlannerConfig()
        self.capacity_fn = capacity
        self.gpus: dict[str, Geometry] = {g: geometry(m) for g, m in gpus.items()}
        self.order = list(gpus)
        self.held: dict[str, list[tuple[str, str, Placement]]] = {g: [] for g in gpus}
        self.services: dict[str, ServiceState] = {}
        self.measured: dict[tuple[str, str, str], float] = {}
        #: GPUs the planner must not use (e.g. held by training the driver will not move)
        self.blocked: set[str] = set()

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

    # -- the rate signal --------------------------------------------------------------------
    def plan_rate(self, s: ServiceState) -> tuple[float, float]:
        """(rate to plan for, trend in req/s per s)."""
        pts = s.history[-self.cfg.trend_points:]
        slope = 0.0
        if len(pts) >= 2:
            tm = sum(t for t, _ in pts) / len(pts)
            rm = sum(r for _, r in pts) / len(pts)
            den = sum((t - tm) ** 2 for t, _ in pts)
            if den > 0:
                slope = sum((t - tm) * (r - rm) for t, r in pts) / den
        lead = catalog.load_time_s(s.spec.model) + self.cfg.window_s
        recent = max((r for _, r in s.history), default=0.0)
        base = max(s.ewma, s.last, recent)
        boost = min(max(0.0, slope) * lead, self.cfg.max_trend_boost * max(s.ewma, s.last))
        return base + boost, slope

    def target(self, s: ServiceState) -> float:
        return self.plan_rate(s)[0] * (1.0 + s.spec.headroom)

    # -- covering ---------------------------------------------------------------------------
    def cheapest(self, spec: ServiceSpec, need: float, at_least: int, at_most: int
                 ) -> list[str] | None:
        """Fewest compute slices (then fewest replicas) of profiles covering ``need`` with a
        replica count in [at_least, at_most]; None if no count covers it."""
        opts = self.options(spec)
        if not opts:
            return None
        best: tuple[int, int, list[str]] | None = None
        # a covering uses at most need / smallest-capacity + 1 replicas; bound the search
        k_max = min(at_most, max(at_least, 1) + 64)

        def rec(i: int, left: float, count: int, slices: int, chosen: list[str]) -> None:
            nonlocal best
            if best is not None and (slices, count) >= best[:2]:
                return
            if left <= 1e-9 and count >= at_least:
                best = (slices, count, list(chosen))
                return
            if count >= k_max or i >= len(opts):
                return
            name, c, g = opts[i]
            # take this profile once more (stay at i), or move on to the next one
            chosen.append(name)
            rec(i, left - c, count + 1, slices + g, chosen)
            chosen.pop()
            rec(i + 1, left, count, slices, chosen)

        rec(0, need, 0, 0, [])
        return best[2] if best else None

    # -- placement --------------------------------------------------------------------------
    def _slot_on(self, gpu: str, profile: str) -> Placement | None:
        geom = self.gpus[gpu]
        held = [pl for _, _, pl in self.held[gpu]]
        prof = geom.model.profile(profile)
        for start in prof.starts:
            cand = Placement(start, profile)
            if is_valid(geom, [*held, cand]):
                return cand
        return None

    def place(self, s: ServiceState, profile: str, avoid: set[str]) -> tuple[str, Placement
                                                                           ] | None:
        """A GPU and slot for one more replica: GPUs hosting service slices first (fullest
        first), avoiding ``avoid`` (the service's own GPUs) when another GPU can take it."""
        used = [g for g in self.order if self.held[g] and g not in self.blocked]
        used.sort(key=lambda g: -sum(self.gpus[g].model.profile(pl.profile).compute_slices
                                     for _, _, pl in self.held[g]))
        fresh = [g for g in self.order if not self.held[g] and g not in self.blocked]
        for pool in ([g for g in used if g not in avoid], [g for g in fresh if g not in avoid],
                     used, fresh):
            for g in pool:
                slot = self._slot_on(g, profile)
                if slot is not None:
                    return g, slot
        return None

    def _start(self, now: float, s: ServiceState, profile: str, why: dict) -> StartReplica | None:
        own = {r.gpu for r in s.live()}
        avoid = own if len(own) < 2 else set()  # spread over two GPUs, then pack
        spot = self.place(s, profile, avoid)
        if spot is None:
            return None
        gpu, slot = spot
        rid = f"{s.spec.name}-r{s.next_id}"
        s.next_id += 1
        cap = self.cap(s.spec, self.gpus[gpu].model.name, profile)
        s.replicas[rid] = ReplicaState(rid, gpu, slot, cap)
        self.held[gpu].append((s.spec.name, rid, slot))
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
                if spec.name in self.services and not self.services[spec.name].stopped:
                    return []
                self.services[spec.name] = ServiceState(spec)
                return self._plan(now, self.services[spec.name], "submitted")
            case ServiceRateObserved(name=name, rate_rps=rate):
                s = self.services.get(name)
                if s is None or s.stopped:
                    return []
                rate = max(0.0, float(rate))
                s.ewma = rate if not s.history else (
                    self.cfg.ewma_alpha * rate + (1 - self.cfg.ewma_alpha) * s.ewma)
                s.last = rate
                s.history.append((now, rate))
                while s.history and now - s.history[0][0] > self.cfg.lookback_s and \
                        len(s.history) > self.cfg.trend_points:
                    s.history.pop(0)
                return self._plan(now, s, "rate")
            case ReplicaReady(service=name, replica=rid):
                s = self.services.get(name)
                if s is None or rid not in s.replicas:
                    return []
                s.replicas[rid].ready = True
                return self._plan(now, s, "replica_ready")
            case ReplicaDrained(service=name, replica=rid):
                s = self.services.get(name)
                if s is None or rid not in s.replicas:
                    return []
                r = s.replicas.pop(rid)
                self.held[r.gpu] = [h for h in self.held[r.gpu] if h[1] != rid]
                return []
            case ServiceStopped(name=name):
                s = self.services.get(name)
                if s is None or s.stopped:
                    return []
                s.stopped = True
                out = []
                for r in s.replicas.values():
                    if not r.draining:
                        r.draining = True
                        out.append(DrainReplica(name, r.id, why={"reason": "service stopped"}))
                return out
            case ServiceCapacityObserved(service=name, gpu_model=gm, profile=p, capacity_rps=c):
                s = self.services.get(name)
                if s is None:
                    return []
                self.measured[(name, gm, p)] = max(0.0, float(c))
                for r in s.replicas.values():
                    if r.slot.profile == p and self.gpus[r.gpu].model.name == gm:
                        r.capacity = self.measured[(name, gm, p)]
                return self._plan(now, s, "capacity_measured")
        return []

    # -- the plan ---------------------------------------------------------------------------
    def _why(self, s: ServiceState, trigger: str, **kw: object) -> dict:
        rate, slope = self.plan_rate(s)
        return dict(trigger=trigger, service=s.spec.name, rate_rps=round(s.last, 2),
                    smoothed_rps=round(s.ewma, 2), trend_rps_per_s=round(slope, 4),
                    target_rps=round(rate * (1 + s.spec.headroom), 2),
                    slo_ms=s.spec.slo_p99_ms, percentile=s.spec.percentile, **kw)

    def _plan(self, now: float, s: ServiceState, trigger: str
              ) -> list[StartReplica | DrainReplica]:
        out: list[StartReplica | DrainReplica] = []
        spec = s.spec
        target = self.target(s)
        live = s.live()
        covered = sum(r.capacity for r in live)
        if covered + 1e-9 < target or len(live) < spec.min_replicas:
            s.over_since = None
            for r in s.replicas.values():  # take back retiring replicas first: no load time
                if r.retiring and not r.draining and covered + 1e-9 < target:
                    r.retiring = False
                    covered += r.capacity
            live = s.live()
        if covered + 1e-9 < target or len(live) < spec.min_replicas:
            add = self.cheapest(spec, target - covered,
                                max(0, spec.min_replicas - len(live)),
                                spec.max_replicas - len(live))
            if add is None:  # cannot cover within max_replicas: the biggest allowed
                opts = self.options(spec)
                add = [max(opts, key=lambda o: o[1])[0]] * max(
                    0, spec.max_replicas - len(live)) if opts else []
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
        elif now - s.last_out >= self.cfg.cooldown_s and self._oversized(s, target):
            if s.over_since is None:
                s.over_since = now
            elif now - s.over_since >= self.cfg.scale_in_delay_s:
                out += self._scale_in(now, s, target, covered, trigger)
        else:
            s.over_since = None
        out += self._drain_retired(now, s, trigger)
        return out

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
        # keep the live replicas the new covering also uses (largest capacity first)
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
                s, trigger, action="resize", covered_rps=round(covered, 2),
                note=(f"resize {spec.name}: {covered:.1f}/s covered > target {target:.1f}/s "
                      f"x {1 + self.cfg.hysteresis:g} for {self.cfg.scale_in_delay_s:g}s; "
                      f"start {prof} before draining")))
            if d is not None:
                out.append(d)
        s.over_since = None
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
        return [g for g in self.order if self.held[g]]

    def slices_in_use(self, gpu: str) -> int:
        geom = self.gpus[gpu]
        return sum(geom.model.profile(pl.profile).compute_slices for _, _, pl in self.held[gpu])


def spread_ok(replicas: Sequence[ReplicaState]) -> bool:
    """A service with >= 2 replicas spans >= 2 GPUs."""
    live = [r for r in replicas if not r.draining]
    return len(live) < 2 or len({r.gpu for r in live}) >= 2
