"""Gangs: jobs on several whole GPUs, placed beside any policy with a reservation and backfill.

:class:`GangLayer` wraps a policy (every policy: NoPart, OptSta, MISO, miso+ ...). The wrapped
policy sees only one-GPU jobs and the GPUs not held for gangs; it decides exactly as it would
alone. The layer handles the jobs that ask for ``num_gpus > 1`` whole GPUs, as a whole-GPU FIFO
with a reservation and backfill (Slurm's backfill scheduler, one reservation):

1. **Start** (all or nothing): the first queued gang starts on idle GPUs when enough are idle
   (held ones first, then idle GPUs of the policy's view, which it holds,
   :class:`~miso.sched.decisions.HoldGpu`); a gang starts only on whole GPUs
   (:class:`~miso.sched.decisions.StartGang`; a MIG-enabled GPU gives one full-size instance).
2. **Reservation**: when it cannot start, the layer holds the ``num_gpus`` GPUs expected free
   soonest (the latest end of their resident jobs, from each job's remaining work and rate):
   no policy places a new job on them, their jobs run to their end (draining). The gang's
   expected start ``T`` is the latest of those ends.
3. **Backfill**: an idle reserved GPU runs a later job whole (a later gang, or a one-GPU job
   of the policy's queue) when it is expected to finish before ``T``. A backfilled run never
   delays the reservation: once nothing but backfilled runs stands between the gang and its
   GPUs, they are checkpointed and requeued (:class:`~miso.sched.decisions.StopGang`).
4. **Release**: held GPUs no queued gang needs go back to the policy's view (an idle one is
   announced to the policy as a :class:`~miso.sched.events.GpuAdded`, through a ``gang:``
   timer, so a static-layout policy lays it out again).

Gangs wait in FIFO order among themselves (tenancy's fair share does not reorder them).
``node_of`` maps a GPU id to its node: a gang takes GPUs from as few nodes as it can, or exactly
``spec.nodes`` nodes with equal counts when the job asks.

The simulator and the live controller wrap their policy with :func:`with_gangs` only when a
gang may come (a trace with a multi-GPU job; a live cluster), so a run without gangs decides
exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from miso.sched.decisions import (
    Decision,
    HoldGpu,
    PlaceJob,
    ReleaseGpu,
    RequeueJob,
    StartGang,
    StopGang,
    WakeUp,
)
from miso.sched.events import (
    Event,
    GangFailed,
    GangStarted,
    GpuAdded,
    JobFailed,
    JobFinished,
    JobSubmitted,
    Tick,
)
from miso.sched.policy import Policy
from miso.sched.state import ClusterState, GpuState, JobStatus, Phase

#: Timer tag prefix the layer uses to announce a released idle GPU to the wrapped policy.
GANG_TAG = "gang:"
#: How far down the one-GPU queue backfill looks, per call.
BACKFILL_WINDOW = 64


def gpu_node(gpu: str) -> str:
    """The node of a GPU id ``node/gpu`` or ``node:gpu`` (live ids); else the id itself."""
    for sep in ("/", ":"):
        if sep in gpu:
            return gpu.rsplit(sep, 1)[0]
    return gpu


def free_at(state: ClusterState, gs: GpuState, now: float) -> float:
    """When ``gs``'s resident jobs are expected to have ended (inf when a job's remaining work
    or rate is unknown); ``now`` for an idle GPU."""
    t = now
    for j in gs.jobs:
        js = state.jobs[j]
        left = js.remaining_work(now)
        p = js.progress
        if left is None or p is None or p[2] <= 0 or js.status is not JobStatus.RUNNING:
            return math.inf
        t = max(t, now + left / p[2])
    return t


def pick_gpus(pool: Sequence[str], n: int, nodes: int | None,
              node_of: Callable[[str], str]) -> list[str] | None:
    """``n`` GPUs of ``pool`` (in pool order) on as few nodes as possible, or on exactly
    ``nodes`` nodes with ``n / nodes`` each; None when the pool cannot give them."""
    if len(pool) < n:
        return None
    by_node: dict[str, list[str]] = {}
    for g in pool:
        by_node.setdefault(node_of(g), []).append(g)
    if nodes:
        if n % nodes:
            return None
        per = n // nodes
        ok = [gs for gs in by_node.values() if len(gs) >= per]
        if len(ok) < nodes:
            return None
        ok.sort(key=len)  # the tightest nodes first: keep big free nodes whole
        return [g for gs in ok[:nodes] for g in gs[:per]]
    out: list[str] = []
    for gs in sorted(by_node.values(), key=len, reverse=True):
        out.extend(gs[: n - len(out)])
        if len(out) == n:
            return out
    return None


class GangLayer:
    """A policy with gangs (see the module docstring); everything else goes to ``inner``."""

    def __init__(self, inner: Policy, node_of: Callable[[str], str] = gpu_node) -> None:
        self.inner = inner
        self.node_of = node_of
        self.backfills: set[str] = set()   # whole-GPU runs started as backfill
        self._rank: dict[str, int] = {}
        #: (the gang holding the reservation, its expected start) once it holds all its GPUs
        self.reservation: tuple[str, float] | None = None

    @property
    def name(self) -> str:
        return self.inner.name

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- the Policy protocol ------------------------------------------------------------------
    def decide(self, now: float, event: Event, state: ClusterState) -> list[Decision]:
        inner_ev: Event | None = event
        match event:
            case JobSubmitted(job=spec) if spec.gang:
                inner_ev = None
            case GangStarted() | GangFailed():
                inner_ev = None
            case JobFinished(job=j) | JobFailed(job=j) if state.jobs[j].spec.gang:
                inner_ev = None
            case Tick(tag=t) if t.startswith(GANG_TAG):
                g = t[len(GANG_TAG):]
                gs = state.gpus.get(g)
                inner_ev = GpuAdded(g, gs.model) if gs is not None and not gs.jobs \
                    and gs.pending is None else None
        out = list(self.inner.decide(now, inner_ev, state)) if inner_ev is not None else []
        if isinstance(event, JobFinished | JobFailed):
            self.backfills.discard(event.job)
        if state.gangs.queue or state.gangs.gpus:
            out.extend(self.gang_pass(now, state, out))
        return out

    # -- gangs --------------------------------------------------------------------------------
    def _order(self, g: str) -> int:
        r = self._rank.get(g)
        if r is None:
            r = self._rank[g] = len(self._rank)
        return r

    def gang_pass(self, now: float, st: ClusterState, prior: list[Decision]) -> list[Decision]:
        """The layer's decisions after the wrapped policy's ``prior`` ones of this call."""
        book = st.gangs
        touched: set[str] = set()
        placed: set[str] = set()
        for d in prior:
            g = getattr(d, "gpu", None)
            if g is not None:
                touched.add(g)
            if isinstance(d, PlaceJob):
                placed.add(d.job)
            if isinstance(d, RequeueJob) and st.jobs[d.job].gpu is not None:
                touched.add(st.jobs[d.job].gpu)  # type: ignore[arg-type]
        for g in st.gpus:
            self._order(g)
        out: list[Decision] = []
        used: set[str] = set()           # GPUs given a run in this call
        held = sorted(book.gpus, key=self._order)
        idle_held = [g for g in held if book.idle(g)]
        view_idle = [g for g, gs in sorted(st.gpus.items(), key=lambda x: self._order(x[0]))
                     if not gs.jobs and gs.pending is None and g not in touched]

        def start(j: str, gpus: list[str], backfill: bool = False) -> None:
            for g in gpus:
                if g not in book.gpus and g not in held_now:
                    out.append(HoldGpu(g, j))
                    held_now.add(g)
                used.add(g)
            why = {"trigger": "backfill" if backfill else "gang",
                   "note": f"{j} on {len(gpus)} whole GPU(s)"
                           + (" until the reservation starts" if backfill else "")}
            out.append(StartGang(j, tuple(gpus), st.new_plan_id(), why=why))
            placed.add(j)
            if backfill:
                self.backfills.add(j)

        held_now: set[str] = set()
        head: str | None = None
        for j in list(book.queue):
            spec = st.jobs[j].spec
            pool = [g for g in idle_held + view_idle if g not in used]
            got = pick_gpus(pool, spec.num_gpus, spec.nodes, self.node_of)
            if got is not None and head is None:
                start(j, got)
                continue
            head = j
            break
        if head is None:
            self.reservation = None
            # No gang waits: give back every held GPU without a run.
            for g in held:
                if g not in used and book.run_on(g) is None:
                    out.append(ReleaseGpu(g))
                    if book.idle(g):
                        out.append(WakeUp(now, f"{GANG_TAG}{g}"))
            return out
        self._reserve(now, st, head, used, touched, held_now, start, placed, out)
        return out

    def _reserve(self, now: float, st: ClusterState, head: str, used: set[str],
                 touched: set[str], held_now: set[str], start: Callable[..., None],
                 placed: set[str], out: list[Decision]) -> None:
        """Hold the GPUs of ``head``'s reservation, backfill them, protect it (decisions
        appended to ``out``, where ``start`` appends too)."""
        book = st.gangs
        spec = st.jobs[head].spec
        n = spec.num_gpus
        # The reservation's GPUs: held ones without a gang of their own (idle, draining or
        # running a backfill), then the policy's GPUs expected free soonest.
        res = [g for g in book.gpus if g not in used
               and (book.run_on(g) is None or book.run_on(g) in self.backfills)]
        ends: dict[str, float] = {}
        for g in res:
            gs = book.gpus[g]
            run = book.run_on(g)
            ends[g] = now if run is not None else free_at(st, gs, now)
        if len(res) < n:
            cands = []
            for g, gs in st.gpus.items():
                if g in touched or g in used or gs.pending is not None \
                        or gs.phase not in (Phase.IDLE, Phase.RUNNING):
                    continue
                cands.append((free_at(st, gs, now), self._order(g), g))
            cands.sort()
            for t, _, g in cands[: n - len(res)]:
                out.append(HoldGpu(g, head))
                held_now.add(g)
                res.append(g)
                ends[g] = t
        elif len(res) > n:
            # Keep the n expected free soonest; give back the others that run nothing.
            res.sort(key=lambda g: (ends[g], self._order(g)))
            for g in res[n:]:
                if book.run_on(g) is None:
                    out.append(ReleaseGpu(g))
                    if book.idle(g):
                        out.append(WakeUp(now, f"{GANG_TAG}{g}"))
            res = res[:n]
        t_start = max((ends[g] for g in res), default=now)
        self.reservation = (head, t_start) if len(res) >= n else None
        if len(res) < n:
            return  # the cluster cannot hold it now (GPUs busy with plans): next event
        backfilled = {g: book.run_on(g) for g in res if book.run_on(g) in self.backfills}
        draining = [g for g in res if g in book.gpus and book.gpus[g].jobs
                    and g not in backfilled]
        if not draining and all(g in book.gpus for g in res):
            # Only backfilled runs (if any) stand between the gang and its GPUs: stop them.
            stopped = {j for j in backfilled.values() if j is not None}
            for j in sorted(stopped):
                out.append(StopGang(j, f"the reservation of {head} starts"))
                self.backfills.discard(j)
            got = pick_gpus(sorted(res, key=self._order), n, spec.nodes, self.node_of)
            if got is not None:
                start(head, got)
                return
        # Backfill the idle reserved GPUs with later jobs expected to end before t_start.
        free = [g for g in sorted(res, key=self._order)
                if g in book.gpus and book.idle(g) and g not in used]
        if not free:
            return
        horizon = t_start - now
        cands: list[tuple[float, str]] = []
        for j in book.queue:
            if j != head and j not in placed:
                cands.append((st.jobs[j].submitted_at, j))
        for j in st.queue[:BACKFILL_WINDOW]:
            if j not in placed:
                cands.append((st.jobs[j].submitted_at, j))
        for _, j in sorted(cands):
            js = st.jobs[j]
            k = js.spec.num_gpus
            left = js.remaining_work(now)
            if not js.spec.checkpointable or left is None or left > horizon or k > len(free):
                continue
            full = st.gangs.gpus[free[0]].geom.model.full_profile().memory_gib
            if js.spec.memory_gb > full + 1e-9:
                continue
            got = pick_gpus(free, k, js.spec.nodes, self.node_of)
            if got is None:
                continue
            start(j, got, backfill=True)
            free = [g for g in free if g not in got]
            if not free:
                break


def with_gangs(policy: Policy, node_of: Callable[[str], str] = gpu_node) -> GangLayer:
    """``policy`` with gangs (:class:`GangLayer`)."""
    return GangLayer(policy, node_of)
