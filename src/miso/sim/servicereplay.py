"""Replay a live service run in simulation: the same arrivals, the same planner, the model.

A live run (``miso load`` through the router, replicas of ``python -m miso.emuserve``) gives
its request send times, one replica's slice and the time a replica took from its start to
ready. :func:`replay` runs the same arrivals through what the live service manager runs: the
rate over the last ``rate_window_s`` observed every ``tick_s`` and fed to the same
:class:`~miso.sched.plannedscale.PlannedScaler` (the core's
:class:`~miso.sched.serviceplan.ServicePlanner`), a started replica ready ``ready_delay_s``
later, a drained one out of rotation at once; requests go round-robin over the ready replicas
(the router sends each to the least loaded one) and each replica serves its requests by the
emulated server's latency model (:mod:`miso.serving.emulated`, dynamic batching,
:func:`miso.serving.replica.simulate_replica`). Pure: arrays in, figures out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from miso.sched.plannedscale import PlannedScaler
from miso.sched.serviceplan import PlannerConfig
from miso.sched.services import ServiceSpec, StartReplica
from miso.serving import catalog, emulated
from miso.serving.replica import simulate_replica


@dataclass
class ReplayResult:
    """Per request its latency (s, NaN: no replica), and the ready replicas each second."""

    latency_s: np.ndarray
    replicas: list[tuple[float, int]] = field(default_factory=list)

    def attainment(self, slo_ms: float) -> float:
        if not len(self.latency_s):
            return 1.0
        lat = np.nan_to_num(self.latency_s, nan=np.inf)
        return float((lat <= slo_ms / 1000.0).mean())


def replay(arrivals_s: Sequence[float], spec: ServiceSpec, *, gpu_model: str, profile: str,
           capacity_rps: float, ready_delay_s: float,
           slowdown: float = emulated.DEFAULT_SLOWDOWN, initial_ready: int = 1,
           tick_s: float = 1.0, rate_window_s: float = 10.0, slots: int | None = None,
           config: PlannerConfig | None = None) -> ReplayResult:
    """Simulate the live service manager on ``arrivals_s`` (see the module docstring).
    ``slots``: the most replicas that hold a slice at once (the cluster's room for them; a
    start beyond it waits for a drain, as a queued replica job does live)."""
    arr = np.sort(np.asarray(arrivals_s, dtype=float))
    scaler = PlannedScaler(config) if config is not None else PlannedScaler()
    ready_at: dict[str, float] = {}  # planner id -> when it serves
    gone_at: dict[str, float] = {}  # planner id -> when it left rotation
    pending: list[tuple[float, str]] = []
    queued: list[str] = []  # starts waiting for a slot
    held: set[str] = set()

    def start(now: float, rid: str) -> None:
        if slots is not None and len(held) >= slots:
            queued.append(rid)
            return
        held.add(rid)
        pending.append((now + ready_delay_s, rid))

    def apply(now: float, decisions: list) -> None:  # noqa: ANN001 - planner decisions
        for d in decisions:
            if isinstance(d, StartReplica):
                start(now, d.replica)
            else:
                gone_at[d.replica] = now
                held.discard(d.replica)
                if d.replica in queued:
                    queued.remove(d.replica)
                scaler.drained(now, spec.name, d.replica)
                while queued and (slots is None or len(held) < slots):
                    start(now, queued.pop(0))

    first = scaler.submit(0.0, spec, capacity_rps)
    for i, d in enumerate(first):
        if isinstance(d, StartReplica) and i < initial_ready:
            ready_at[d.replica] = 0.0
            held.add(d.replica)
            apply(0.0, scaler.ready(0.0, spec.name, d.replica))
        else:
            apply(0.0, [d])
    end = float(arr[-1]) if len(arr) else 0.0
    t = 0.0
    timeline: list[tuple[float, int]] = []
    while t <= end + tick_s:
        t += tick_s
        for when, rid in sorted(p for p in pending if p[0] <= t):
            pending.remove((when, rid))
            if rid not in gone_at:
                ready_at[rid] = when
                apply(when, scaler.ready(when, spec.name, rid))
        lo, hi = np.searchsorted(arr, [t - rate_window_s, t])
        apply(t, scaler.rate(t, spec.name, (hi - lo) / rate_window_s))
        timeline.append((t, sum(1 for r, a in ready_at.items()
                                if a <= t and gone_at.get(r, math.inf) > t)))
    # route: round-robin over the replicas ready at each request's arrival
    ids = sorted(ready_at, key=lambda r: ready_at[r])
    owner = np.full(len(arr), -1)
    rr = 0
    for k, a in enumerate(arr):
        live = [i for i, r in enumerate(ids) if ready_at[r] <= a < gone_at.get(r, math.inf)]
        if live:
            owner[k] = live[rr % len(live)]
            rr += 1
    lat = np.full(len(arr), np.nan)
    mb = max(1, catalog.max_batch(spec.model, gpu_model, profile))
    times = [emulated.service_time_s(spec.model, gpu_model, profile, b, slowdown)
             for b in range(mb + 1)]
    for i, rid in enumerate(ids):
        idx = np.nonzero(owner == i)[0]
        if len(idx):
            run = simulate_replica(arr[idx], lambda b: times[b], mb, ready_s=ready_at[rid])
            lat[idx] = run.latency_s
    return ReplayResult(lat, timeline)
