"""Simulating inference services on a MIG cluster, request by request.

A run: every service's request trace, one way of giving services replicas (``miso+``: the
covering planner :class:`~miso.sched.serviceplan.ServicePlanner` on MIG slices; the
baselines ``static-gpu``, ``static-mig`` and ``hpa-gpu``), and the GPUs. Replicas come from
the strategy's decisions (a new replica is ready after the MIG reconfiguration and the model's
load time; a drained one holds its slice until its in-flight requests are done). Every
request is routed at its arrival to a ready, non-draining replica (at random, weighted by
capacity: each replica sees a thinned stream) and then served by that replica's queue
(:func:`miso.serving.replica.simulate_replica`: dynamic batching, queueing). A request that
finds no replica is dropped. Attainment is measured on these per-request latencies.

Services run warm: the replicas a strategy chooses for the first window's rate are ready at
t = 0 (the measured hour starts with the services already up).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from miso.mig import Placement, geometry
from miso.sched.serviceplan import (
    CapacityFn,
    PlannerConfig,
    ServicePlanner,
    catalogue_capacity,
)
from miso.sched.services import (
    DrainReplica,
    ReplicaDrained,
    ReplicaReady,
    ServiceRateObserved,
    ServiceSpec,
    ServiceSubmitted,
    StartReplica,
)
from miso.serving import catalog
from miso.serving.replica import simulate_replica
from miso.serving.traces import RequestTrace

STRATEGIES = ("miso+", "static-gpu", "static-mig", "hpa-gpu")

#: HPA's default scale-down stabilisation window (Kubernetes): the highest recommendation of
#: the last 300 s is kept.
HPA_STABILISE_S = 300.0


@dataclass
class ReplicaRecord:
    """One replica's life: slice held from ``start_s`` to ``gone_s``, serving from
    ``ready_s`` until ``drain_s``."""

    service: str
    id: str
    gpu: str
    profile: str
    slices: int
    capacity: float
    start_s: float
    ready_s: float
    drain_s: float = math.inf
    gone_s: float = math.inf


@dataclass
class ServiceOutcome:
    """Per-service figures of one run (the JSON of ``miso simulate --services``)."""

    name: str
    model: str
    slo_ms: float
    requests: int
    attainment: float
    attainment_minutes: list[float]
    minutes_ok: float
    p50_ms: float
    p99_ms: float
    dropped: int
    slice_hours: float
    resizes: int

    def to_json(self) -> dict:
        return {
            "model": self.model, "slo_ms": self.slo_ms, "requests": self.requests,
            "attainment": round(self.attainment, 6),
            "attainment_per_minute": [round(a, 5) for a in self.attainment_minutes],
            "minutes_meeting_99": round(self.minutes_ok, 5),
            "p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3),
            "dropped": self.dropped, "slice_hours": round(self.slice_hours, 4),
            "resizes": self.resizes,
        }


@dataclass
class ServicesRun:
    """What one strategy did: replicas, decisions with reasons, per-service outcomes."""

    strategy: str
    span_s: float
    replicas: list[ReplicaRecord]
    log: list[tuple[float, object]] = field(default_factory=list)
    outcomes: dict[str, ServiceOutcome] = field(default_factory=dict)

    @property
    def slice_hours(self) -> float:
        """GPU-fraction-hours held by services (compute slices / 7 of the A100 class)."""
        return sum(o.slice_hours for o in self.outcomes.values())

    @property
    def attainment_min(self) -> float:
        return min((o.attainment for o in self.outcomes.values()), default=1.0)

    @property
    def dropped(self) -> int:
        return sum(o.dropped for o in self.outcomes.values())

    def gpu_intervals(self) -> dict[str, list[tuple[float, float]]]:
        """Per GPU, the merged intervals in which it holds at least one service slice."""
        by: dict[str, list[tuple[float, float]]] = {}
        for r in self.replicas:
            by.setdefault(r.gpu, []).append((r.start_s, min(r.gone_s, math.inf)))
        out = {}
        for g, iv in by.items():
            iv.sort()
            merged = [list(iv[0])]
            for a, b in iv[1:]:
                if a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            out[g] = [(a, b) for a, b in merged]
        return out

    def mean_gpus_held(self) -> float:
        """Whole GPUs hosting at least one service slice, averaged over the span."""
        tot = 0.0
        for iv in self.gpu_intervals().values():
            tot += sum(min(b, self.span_s) - min(a, self.span_s) for a, b in iv)
        return tot / self.span_s


#: The router's rate signal: the highest rate over ``RATE_SUB_S`` sub-windows of a window
#: (a window's mean hides the bursts a replica's queue sees).
RATE_SUB_S = 10.0


def window_rates(trace: RequestTrace, window_s: float, n: int) -> np.ndarray:
    """Per window, the peak rate of its ``RATE_SUB_S`` sub-windows (req/s)."""
    sub = min(RATE_SUB_S, window_s)
    per = max(1, int(round(window_s / sub)))
    m = n * per
    counts = np.bincount((trace.arrivals_s // (window_s / per)).astype(int), minlength=m)[:m]
    return (counts.reshape(n, per) / (window_s / per)).max(axis=1)


def drain_time_s(spec: ServiceSpec) -> float:
    """How long a drained replica holds its slice: its in-flight requests finish within a
    few service times (twice the SLO, at least 1 s)."""
    return max(1.0, 2.0 * spec.slo_p99_ms / 1000.0)


class _Book:
    """Turns start/drain decisions into replica records and acknowledgement events."""

    def __init__(self, specs: dict[str, ServiceSpec], gpu_model: str, reconfig_s: float) -> None:
        self.specs = specs
        self.gm = gpu_model
        self.geom = geometry(gpu_model)
        self.reconfig_s = reconfig_s
        self.recs: dict[str, ReplicaRecord] = {}
        self.heap: list[tuple[float, int, object]] = []
        self.seq = 0

    def push(self, t: float, ev: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, ev))

    def start(self, now: float, d: StartReplica, warm: bool, capacity: float) -> None:
        spec = self.specs[d.service]
        now = max(now, 0.0)
        ready = now if warm else now + self.reconfig_s + catalog.load_time_s(spec.model)
        slices = self.geom.model.profile(d.profile).compute_slices
        self.recs[d.replica] = ReplicaRecord(d.service, d.replica, d.gpu, d.profile, slices,
                                             capacity, now, ready)
        self.push(ready, ReplicaReady(d.service, d.replica))

    def drain(self, now: float, d: DrainReplica, warm: bool = False) -> None:
        now = max(now, 0.0)
        r = self.recs[d.replica]
        r.drain_s = now
        spec = self.specs[d.service]
        # in-flight requests finish within a few service times; the slice is then destroyed
        # (drained while warming up, before the first measured request: nothing in flight)
        r.gone_s = now if warm else now + drain_time_s(spec)
        self.push(r.gone_s, ReplicaDrained(d.service, d.replica))


#: Capacities are calibrated on the first this many seconds of each service's trace (its
#: recorded traffic, as a load test from recorded requests would); None: Poisson arrivals.
CALIBRATION_S: float | None = 600.0


def calibrated_capacity(services: Sequence[tuple[ServiceSpec, RequestTrace]],
                        calibration_s: float | None = CALIBRATION_S) -> CapacityFn:
    """A replica's capacity at the SLO for arrivals shaped like the first ``calibration_s``
    of its service's trace (its bursts), or under Poisson arrivals when None."""
    if calibration_s is None:
        return catalogue_capacity
    shapes = {s.name: tr.arrivals_s[tr.arrivals_s < calibration_s] for s, tr in services}
    cache: dict[tuple[str, str, str], float] = {}

    def cap(spec: ServiceSpec, gpu_model: str, profile: str) -> float:
        key = (spec.name, gpu_model, profile)
        if key not in cache:
            arr = shapes.get(spec.name)
            cache[key] = (catalog.capacity_on_arrivals_rps(
                spec.model, gpu_model, profile, spec.slo_p99_ms, arr, spec.percentile)
                if arr is not None and len(arr) >= 100 else catalogue_capacity(
                    spec, gpu_model, profile))
        return cache[key]

    return cap


def run_miso(services: Sequence[tuple[ServiceSpec, RequestTrace]], gpus: dict[str, str],
             span_s: float, window_s: float = 30.0, reconfig_s: float = 4.0,
             config: PlannerConfig | None = None, capacity: CapacityFn | None = None
             ) -> ServicesRun:
    """The covering planner on MIG slices, driven by per-window observed rates."""
    gm = next(iter(gpus.values()))
    specs = {s.name: s for s, _ in services}
    planner = ServicePlanner(gpus, config or PlannerConfig(window_s=window_s),
                             capacity or catalogue_capacity)
    book = _Book(specs, gm, reconfig_s)
    n = math.ceil(span_s / window_s)
    rates = {s.name: window_rates(tr, window_s, n) for s, tr in services}
    log: list[tuple[float, object]] = []

    def handle(now: float, ev: object, warm: bool = False) -> None:
        for d in planner.observe(now, ev):
            log.append((now, d))
            if isinstance(d, StartReplica):
                book.start(now, d, warm, planner.services[d.service].replicas[d.replica].capacity)
            else:
                book.drain(now, d, warm)

    cfg = planner.cfg
    back = max(1, int(cfg.lookback_s // window_s))
    for s, _ in services:  # warm start: the service ran this hour before (the trace as a
        # cycle): its last lookback of rates is known and its replicas are ready at t = 0
        prior = rates[s.name][-back:]
        t0 = -window_s * len(prior)
        handle(t0, ServiceSubmitted(s), warm=True)
        for i, r in enumerate(prior):
            handle(t0 + window_s * (i + 1), ServiceRateObserved(s.name, float(r)), warm=True)
    for k in range(1, n + 1):
        t = k * window_s
        for s, _ in services:
            book.push(t, ServiceRateObserved(s.name, float(rates[s.name][k - 1])))
    while book.heap:
        t, _, ev = heapq.heappop(book.heap)
        handle(t, ev, warm=t <= 0.0)  # acknowledgements of the warm start come at t = 0
    return ServicesRun("miso+", span_s, list(book.recs.values()), log)


def _whole_gpu_capacity(spec: ServiceSpec, gm: str, capacity: CapacityFn | None = None
                        ) -> tuple[str, float]:
    full = geometry(gm).model.full_profile().name
    return full, (capacity or catalogue_capacity)(spec, gm, full)


def run_static(services: Sequence[tuple[ServiceSpec, RequestTrace]], gpus: dict[str, str],
               span_s: float, window_s: float = 30.0, mig: bool = False,
               capacity: CapacityFn | None = None) -> ServicesRun:
    """Static peak sizing, known in hindsight: whole GPUs (``mig=False``, what operators do)
    or the cheapest MIG covering of the peak, packed by the planner's placement
    (``mig=True``, MIG-serving's method)."""
    gm = next(iter(gpus.values()))
    n = math.ceil(span_s / window_s)
    planner = ServicePlanner(gpus, capacity=capacity or catalogue_capacity)
    specs = {s.name: s for s, _ in services}
    book = _Book(specs, gm, 0.0)
    log: list[tuple[float, object]] = []
    free = list(gpus)
    for s, tr in services:
        peak = float(window_rates(tr, window_s, n).max()) * (1.0 + s.headroom)
        if mig:
            planner.register(s)
            want = planner.cheapest(s, peak, max(s.min_replicas, 1), s.max_replicas) or []
            for prof in want:
                d = planner.start_replica(0.0, s.name, prof, {
                    "note": f"static MIG: {s.name} peak {peak:.1f}/s, {prof}"})
                if d is None:
                    raise RuntimeError(f"static-mig: no room for {s.name}")
                log.append((0.0, d))
                book.start(0.0, d, True, planner.services[s.name].replicas[d.replica].capacity)
        else:
            full, cap = _whole_gpu_capacity(s, gm, capacity)
            k = max(s.min_replicas, 1, math.ceil(peak / cap)) if cap > 0 else 0
            for i in range(k):
                if not free:
                    raise RuntimeError(f"static-gpu: no GPU left for {s.name}")
                g = free.pop(0)
                d = StartReplica(s.name, f"{s.name}-r{i}", g, Placement(0, full),
                                 why={"note": f"static whole GPUs: {s.name} peak {peak:.1f}/s"})
                log.append((0.0, d))
                book.start(0.0, d, True, cap)
    return ServicesRun("static-mig" if mig else "static-gpu", span_s,
                       list(book.recs.values()), log)


def run_hpa(services: Sequence[tuple[ServiceSpec, RequestTrace]], gpus: dict[str, str],
            span_s: float, window_s: float = 30.0, reconfig_s: float = 4.0,
            capacity: CapacityFn | None = None) -> ServicesRun:
    """Kubernetes-HPA-style reactive autoscaling on whole GPUs: every ``window_s`` the
    replica count is ceil(rate x (1 + headroom) / capacity of a whole GPU), scale-down held
    by the default 300 s stabilisation window; no MIG."""
    gm = next(iter(gpus.values()))
    specs = {s.name: s for s, _ in services}
    book = _Book(specs, gm, reconfig_s)
    n = math.ceil(span_s / window_s)
    free = list(gpus)
    active: dict[str, list[str]] = {s.name: [] for s, _ in services}
    gpu_of: dict[str, str] = {}
    log: list[tuple[float, object]] = []
    counters = {s.name: 0 for s, _ in services}
    history: dict[str, list[tuple[float, int]]] = {s.name: [] for s, _ in services}
    pending_free: list[tuple[float, str]] = []
    for k in range(0, n):
        t = k * window_s
        still = []
        for when, g in pending_free:
            if when <= t:
                free.append(g)
            else:
                still.append((when, g))
        pending_free = still
        for s, tr in services:
            rate = float(window_rates(tr, window_s, n)[max(0, k - 1) if k else 0])
            full, cap = _whole_gpu_capacity(s, gm, capacity)
            want = max(s.min_replicas, 1, math.ceil(rate * (1 + s.headroom) / cap))
            want = min(want, s.max_replicas)
            hist = history[s.name]
            hist.append((t, want))
            hist[:] = [(a, w) for a, w in hist if t - a <= HPA_STABILISE_S]
            target = max(w for _, w in hist)
            have = active[s.name]
            while len(have) < target and free:
                g = free.pop(0)
                rid = f"{s.name}-r{counters[s.name]}"
                counters[s.name] += 1
                d = StartReplica(s.name, rid, g, Placement(0, full), why={
                    "note": f"hpa {s.name}: rate {rate:.1f}/s -> {target} whole GPUs"})
                log.append((t, d))
                book.start(t, d, k == 0, cap)
                have.append(rid)
                gpu_of[rid] = g
            while len(have) > target:
                rid = have.pop()
                d2 = DrainReplica(s.name, rid, why={
                    "note": f"hpa {s.name}: rate {rate:.1f}/s -> {target} whole GPUs"})
                log.append((t, d2))
                book.drain(t, d2)
                pending_free.append((book.recs[rid].gone_s, gpu_of[rid]))
    return ServicesRun("hpa-gpu", span_s, list(book.recs.values()), log)


def measure(run: ServicesRun, services: Sequence[tuple[ServiceSpec, RequestTrace]],
            gpu_model: str, seed: int = 0) -> ServicesRun:
    """Route and serve every request; fill ``run.outcomes``."""
    rng = np.random.default_rng(seed)
    for spec, tr in services:
        reps = [r for r in run.replicas if r.service == spec.name]
        arr = tr.arrivals_s
        owner = np.full(len(arr), -1, dtype=int)
        cuts = sorted({0.0, *(r.ready_s for r in reps), *(r.drain_s for r in reps
                                                         if math.isfinite(r.drain_s))})
        cuts.append(math.inf)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            lo, hi = np.searchsorted(arr, a, "left"), np.searchsorted(arr, b, "left")
            if hi <= lo:
                continue
            act = [i for i, r in enumerate(reps) if r.ready_s <= a and r.drain_s >= b]
            if not act:
                continue
            w = np.array([reps[i].capacity for i in act], dtype=float)
            w = w / w.sum() if w.sum() > 0 else np.full(len(act), 1.0 / len(act))
            owner[lo:hi] = np.asarray(act)[rng.choice(len(act), size=hi - lo, p=w)]
        lat = np.full(len(arr), np.nan)
        for i, r in enumerate(reps):
            idx = np.nonzero(owner == i)[0]
            if len(idx) == 0:
                continue
            mb = catalog.max_batch(spec.model, gpu_model, r.profile)
            out = simulate_replica(
                arr[idx], lambda b, p=r.profile, m=spec.model: catalog.service_time_s(
                    m, gpu_model, p, b),
                mb, ready_s=r.ready_s)
            lat[idx] = out.latency_s
        slo = spec.slo_p99_ms / 1000.0
        served = ~np.isnan(lat)
        ok = served & (np.nan_to_num(lat, nan=np.inf) <= slo)
        minute = (arr // 60).astype(int)
        per_min = []
        for m in range(int(minute.max()) + 1 if len(arr) else 0):
            sel = minute == m
            if sel.any():
                per_min.append(float(ok[sel].mean()))
        lats = lat[served] * 1000.0
        sh = sum(r.slices / 7.0 * (min(r.gone_s, run.span_s) - min(r.start_s, run.span_s))
                 for r in reps) / 3600.0
        starts = [d for t, d in run.log if isinstance(d, StartReplica)
                  and d.service == spec.name and t > 0]
        drains = [d for _, d in run.log if isinstance(d, DrainReplica) and d.service == spec.name]
        run.outcomes[spec.name] = ServiceOutcome(
            spec.name, spec.model, spec.slo_p99_ms, len(arr),
            float(ok.mean()) if len(arr) else 1.0, per_min,
            float(np.mean([a >= 0.99 for a in per_min])) if per_min else 1.0,
            float(np.percentile(lats, 50)) if len(lats) else 0.0,
            float(np.percentile(lats, 99)) if len(lats) else 0.0,
            int((~served).sum()), sh, len(starts) + len(drains))
    return run


def run_strategy(strategy: str, services: Sequence[tuple[ServiceSpec, RequestTrace]],
                 gpus: dict[str, str], window_s: float = 30.0, seed: int = 0,
                 span_s: float | None = None, config: PlannerConfig | None = None,
                 calibration_s: float | None = CALIBRATION_S) -> ServicesRun:
    """One strategy over the services' traces, measured request by request; every strategy
    sizes replicas with the same capacities (:func:`calibrated_capacity`)."""
    span = span_s if span_s is not None else max(tr.duration_s for _, tr in services)
    cap = calibrated_capacity(services, calibration_s)
    if strategy == "miso+":
        run = run_miso(services, gpus, span, window_s, config=config, capacity=cap)
    elif strategy == "static-gpu":
        run = run_static(services, gpus, span, window_s, mig=False, capacity=cap)
    elif strategy == "static-mig":
        run = run_static(services, gpus, span, window_s, mig=True, capacity=cap)
    elif strategy == "hpa-gpu":
        run = run_hpa(services, gpus, span, window_s, capacity=cap)
    else:
        raise ValueError(f"unknown service strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    return measure(run, services, next(iter(gpus.values())), seed)
