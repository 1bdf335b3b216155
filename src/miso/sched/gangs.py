"""Gangs: jobs on several whole GPUs, placed beside any policy with a reservation and backfill.

:class:`GangLayer` wraps a policy (every policy: NoPart, OptSta, MISO, miso+ ...). The wrapped
policy sees only one-GPU jobs and the GPUs not held for gangs; it decides exactly as it would
alone. The layer handles the jobs that ask for ``num_gpus > 1`` whole GPUs, as a whole-GPU FIFO
with a reservation and backfill (Slurm's backfill scheduler, one reservation):

1. **Start** (all or nothing): the first queued gang starts on idle GPUs when enough are idle
   (held ones first, then idle GPUs of the policy's view, which it holds,
   :class:`~miso.sched.decisions.HoldGpu`); a gang starts only on whole GPUs
   (:class:`~miso.sched.decisions.StartGang`; a MIG-enabled GPU gives one full-size instance).
2. **Reservation**: when it cannot start, the layer takes the ``num_gpus`` GPUs expected free
   soonest (the latest end of their resident jobs, from each job's remaining work and rate),
   counting the GPUs of the whole-GPU runs under way at their run's end as Slurm counts every
   running job: of the policy's GPUs among them, it holds them (no policy places a new job on
   them, their jobs run to their end: draining); a run's GPUs stay its run's until it ends;
   held GPUs no longer among them go back. The gang's expected start ``T`` is the latest of
   those ends.
3. **Backfill**: an idle reserved GPU runs a later job whole (a later gang, or a one-GPU job
   of the policy's queue) when it is expected to finish before ``T``, or when its work is
   unknown (live, a newcomer declares none) and it can checkpoint. A backfilled run never
   delays the reservation: once nothing but backfilled runs stands between the gang and its
   GPUs, they are checkpointed and requeued (:class:`~miso.sched.decisions.StopGang`).
4. **Release**: held GPUs no queued gang needs go back to the policy's view (an idle one is
   announced to the policy as a :class:`~miso.sched.events.GpuAdded`, through a ``gang:``
   timer, so a static-layout policy lays it out again).

Gangs wait in FIFO order among themselves; with tenancy's fair share on, in its order
(priority, then the owner's fair-share level, then FIFO: :func:`miso.sched.fairorder.ranked`),
so the reservation is for the gang of the owner fair share ranks first, not the oldest gang;
with fair share's reclaim too, that gang, when owed its room and its reservation would start
only after ``min_run_s``, starts on over-entitled owners' stopped whole-GPU runs
(:mod:`miso.sched.gangreclaim`), and when those are not enough on whole GPUs of the policies'
view emptied of over-entitled owners' one-GPU jobs (given back to the policy when the gang
ends).
``node_of`` maps a GPU id to its node: a gang takes GPUs from as few nodes as it can, or exactly
``spec.nodes`` nodes with equal counts when the job asks.

The simulator and the live controller wrap their policy with :func:`with_gangs` only when a
gang may come (a trace with a multi-GPU job; a live cluster), so a run without gangs decides
exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
from miso.sched.fairorder import ranked
from miso.sched.gangreclaim import reclaim_for, takeable
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
        #: whole-GPU run -> when this layer started it (fair share's gang reclaim spares
        #: runs younger than ``min_run_s``)
        self.started: dict[str, float] = {}
        self._rank: dict[str, int] = {}
        #: (the gang holding the reservation, its expected start) once it holds all its GPUs
        self.reservation: tuple[str, float] | None = None
        #: GPUs of the policies' view that fair share's gang reclaim emptied for an owed gang:
        #: given back to the policy when that run ends, not kept for the next gang
        self.lent: set[str] = set()

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
            self.started.pop(event.job, None)
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
        for g in st.gpus:
            self._order(g)
        ps = GangPass.after(now, st, prior)
        self._return_lent(ps)
        head = self._start_in_order(ps)
        if head is None:
            self.reservation = None
            # No gang waits: give back every held GPU without a run.
            for g in sorted(st.gangs.gpus, key=self._order):
                if g not in ps.used and st.gangs.run_on(g) is None:
                    ps.release(g)
            return ps.out
        self._reserve(ps, head)
        return ps.out

    def _return_lent(self, ps: GangPass) -> None:
        """Give back to the policy the lent GPUs (:attr:`lent`) whose run has ended: the
        room was returned for one owed gang, not for the gangs queued behind it."""
        book = ps.st.gangs
        for g in sorted(self.lent, key=self._order):
            if g in book.gpus and book.run_on(g) is not None:
                continue
            self.lent.discard(g)
            if g in book.gpus and not book.gpus[g].jobs:
                ps.release(g)
                ps.used.add(g)   # not this pass's to start or reserve on

    def _start_in_order(self, ps: GangPass) -> str | None:
        """Start queued gangs in FIFO order while each finds its GPUs idle; the first that
        cannot start (the head of the queue, to reserve for), or None."""
        st, book = ps.st, ps.st.gangs
        idle_held = [g for g in sorted(book.gpus, key=self._order) if book.idle(g)]
        view_idle = [g for g, gs in sorted(st.gpus.items(), key=lambda x: self._order(x[0]))
                     if not gs.jobs and gs.pending is None and g not in ps.touched
                     and not st.services.by_gpu.get(g)]  # (replicas hold slices of it)
        for j in self.queue_order(st):
            spec = st.jobs[j].spec
            pool = [g for g in idle_held + view_idle if g not in ps.used]
            got = pick_gpus(pool, spec.num_gpus, spec.nodes, self.node_of)
            if got is None:
                return j
            self._start(ps, j, got)
        return None

    @staticmethod
    def queue_order(st: ClusterState) -> list[str]:
        """The queued gangs in the order they start and reserve: FIFO, or tenancy's order with
        fair share on (a gang of an owner below its share is not kept behind the reservations
        of owners above theirs)."""
        ten = st.tenancy
        if ten is None or not ten.config.fair_share:
            return list(st.gangs.queue)
        return ranked(ten, list(st.gangs.queue))

    def _start(self, ps: GangPass, j: str, gpus: list[str], backfill: bool = False) -> None:
        ps.start(j, gpus, backfill)
        self.started[j] = ps.now
        if backfill:
            self.backfills.add(j)

    def _reserve(self, ps: GangPass, head: str) -> None:
        """Hold the GPUs of ``head``'s reservation, start it when only backfilled runs stand
        in its way, else backfill its idle GPUs."""
        spec = ps.st.jobs[head].spec
        res, ends = self._reservation_gpus(ps, head)
        t_start = max((ends[g] for g in res), default=ps.now)
        full = len(res) >= spec.num_gpus
        self.reservation = (head, t_start) if full else None
        if full and self._start_reserved(ps, head, res):
            return
        if self._reclaim(ps, head, t_start if full else math.inf, res if full else []):
            self.reservation = None
            return
        if not full:
            return  # the cluster cannot hold it now (GPUs busy with plans): next event
        self._backfill(ps, head, res, t_start)

    def _reclaim(self, ps: GangPass, head: str, t_start: float, res: list[str]) -> bool:
        """With fair share's reclaim, start ``head`` on other owners' stopped whole-GPU runs
        when its reservation would start only after ``min_run_s``
        (:func:`miso.sched.gangreclaim.reclaim_for`)."""
        ten = ps.st.tenancy
        if ten is None or not ten.config.entitled \
                or t_start - ps.now <= ten.config.min_run_s:
            return False
        lent = reclaim_for(ps, head, self.backfills, self.started,
                           lambda pool, n, nodes: pick_gpus(pool, n, nodes, self.node_of), res)
        if lent is None:
            return False
        self.lent |= lent
        self.started[head] = ps.now
        return True

    def _reservation_gpus(self, ps: GangPass, head: str) -> tuple[list[str], dict[str, float]]:
        """The reservation's GPUs and when each is expected free: the ``num_gpus`` expected
        free soonest of the held ones without a gang of their own (idle, draining or running
        a backfill), the policy's GPUs and the GPUs of the whole-GPU runs under way (as Slurm
        counts every running job's end: a run ending soon frees GPUs without draining any).
        The policy's GPUs chosen are held (they drain); held ones not chosen go back. With
        gang reclaim, a GPU that may be emptied for ``head`` ranks by when (``takeable``)."""
        book, n = ps.st.gangs, ps.st.jobs[head].spec.num_gpus
        ends = self._held_free(ps)
        held = list(ends)
        at = takeable(ps, head)   # with gang reclaim: when a GPU may be emptied, if sooner
        # ties: held GPUs first (no churn between GPUs equally far from free)
        cands = sorted([(at(g, ends[g]), 0, self._order(g), g, ends[g]) for g in held]
                       + [(at(g, t), 1, o, g, t) for t, o, g in self._soonest_free(ps)
                          + self._runs_ending(ps)])[:n]
        res = [c[3] for c in cands]
        ends |= {c[3]: c[4] for c in cands}
        keep = set(res)
        for g in sorted(held, key=self._order):
            if g not in keep and book.run_on(g) is None:
                ps.release(g)
        for g in res:
            if g not in book.gpus:
                ps.hold(g, head)
        return res, ends

    def _soonest_free(self, ps: GangPass) -> list[tuple[float, int, str]]:
        """The policy's GPUs this call left alone, by when they are expected free."""
        cands = [(free_at(ps.st, gs, ps.now), self._order(g), g)
                 for g, gs in ps.st.gpus.items()
                 if g not in ps.touched and g not in ps.used and gs.pending is None
                 and gs.phase in (Phase.IDLE, Phase.RUNNING)
                 and not ps.st.services.by_gpu.get(g)]  # service replicas: never whole
        return sorted(cands)

    def _held_free(self, ps: GangPass) -> dict[str, float]:
        """Held GPUs without a run of their own (idle, draining, or running a backfill: free
        now, as a backfill is stopped when the reservation starts), by when each is free."""
        book = ps.st.gangs
        return {g: ps.now if book.run_on(g) is not None else free_at(ps.st, book.gpus[g], ps.now)
                for g in book.gpus if g not in ps.used
                and (book.run_on(g) is None or book.run_on(g) in self.backfills)}

    def _runs_ending(self, ps: GangPass) -> list[tuple[float, int, str]]:
        """The GPUs of the whole-GPU runs under way (not backfills, not started in this
        call), by when their run is expected to end."""
        book = ps.st.gangs
        return [(free_at(ps.st, book.gpus[g], ps.now), self._order(g), g)
                for j, gpus in book.runs.items() if j not in self.backfills
                for g in gpus if g not in ps.used and g in book.gpus]

    def _start_reserved(self, ps: GangPass, head: str, res: list[str]) -> bool:
        """Start ``head`` on its reserved GPUs when nothing but backfilled runs stands in its
        way (those are stopped: a backfill never delays the reservation)."""
        book, spec = ps.st.gangs, ps.st.jobs[head].spec
        backfilled = {g: book.run_on(g) for g in res if book.run_on(g) in self.backfills}
        draining = [g for g in res if g in book.gpus and book.gpus[g].jobs
                    and g not in backfilled]
        if draining or not all(g in book.gpus for g in res):
            return False
        for j in sorted({j for j in backfilled.values() if j is not None}):
            ps.out.append(StopGang(j, f"the reservation of {head} starts"))
            self.backfills.discard(j)
        got = pick_gpus(sorted(res, key=self._order), spec.num_gpus, spec.nodes, self.node_of)
        if got is None:
            return False
        self._start(ps, head, got)
        return True

    def _backfill(self, ps: GangPass, head: str, res: list[str], t_start: float) -> None:
        """Run later jobs whole on the idle reserved GPUs, each only when it is expected to
        end before the reservation starts (``t_start``)."""
        book = ps.st.gangs
        free = [g for g in sorted(res, key=self._order)
                if g in book.gpus and book.idle(g) and g not in ps.used]
        for j in self._backfill_candidates(ps, head):
            if not free:
                break
            got = self._backfill_fit(ps, j, free, t_start - ps.now)
            if got is not None:
                self._start(ps, j, got, backfill=True)
                free = [g for g in free if g not in got]

    def _backfill_candidates(self, ps: GangPass, head: str) -> list[str]:
        """Later gangs and the first one-GPU queued jobs, in submission order; with fair share
        on, in its order (the first :data:`BACKFILL_WINDOW` one-GPU jobs in that order: a
        small owner's short jobs, submitted last behind a flood, are its first, and would
        never be in the window by submission)."""
        st = ps.st
        ten = st.tenancy
        gangs = [j for j in st.gangs.queue if j != head and j not in ps.placed]
        if ten is not None and ten.config.fair_share:
            ones = [j for j in ranked(ten, list(st.queue)) if j not in ps.placed]
            return ranked(ten, gangs + ones[:BACKFILL_WINDOW])
        cands = [(st.jobs[j].submitted_at, j) for j in gangs]
        cands += [(st.jobs[j].submitted_at, j) for j in st.queue[:BACKFILL_WINDOW]
                  if j not in ps.placed]
        return [j for _, j in sorted(cands)]

    def _backfill_fit(self, ps: GangPass, j: str, free: list[str],
                      horizon: float) -> list[str] | None:
        """The GPUs of ``free`` job ``j`` would backfill, or None (it cannot checkpoint, its
        work left is longer than ``horizon``, or it does not fit). A job whose work is unknown
        (live, a newcomer declares none) backfills too: it is checkpointed when the
        reservation starts (:meth:`_start_reserved`), so it never delays it."""
        js = ps.st.jobs[j]
        left = js.remaining_work(ps.now)
        if not js.spec.checkpointable or (left is not None and left > horizon) \
                or js.spec.num_gpus > len(free):
            return None
        full = ps.st.gangs.gpus[free[0]].geom.model.full_profile().memory_gib
        if js.spec.memory_gb > full + 1e-9:
            return None
        return pick_gpus(free, js.spec.num_gpus, js.spec.nodes, self.node_of)


@dataclass
class GangPass:
    """The facts and decisions of one gang pass (one ``decide`` call)."""

    now: float
    st: ClusterState
    touched: set[str]                  # GPUs the wrapped policy decided on in this call
    placed: set[str]                   # jobs placed in this call
    out: list[Decision] = field(default_factory=list)
    used: set[str] = field(default_factory=set)       # GPUs given a run in this call
    held_now: set[str] = field(default_factory=set)   # GPUs held in this call

    @classmethod
    def after(cls, now: float, st: ClusterState, prior: list[Decision]) -> GangPass:
        """A pass after the wrapped policy's ``prior`` decisions of this call."""
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
        return cls(now, st, touched, placed)

    def hold(self, g: str, job: str) -> None:
        self.out.append(HoldGpu(g, job))
        self.held_now.add(g)

    def release(self, g: str) -> None:
        """Give ``g`` back to the policy (announced to it when idle)."""
        self.out.append(ReleaseGpu(g))
        if self.st.gangs.idle(g):
            self.out.append(WakeUp(self.now, f"{GANG_TAG}{g}"))

    def start(self, j: str, gpus: list[str], backfill: bool) -> None:
        for g in gpus:
            if g not in self.st.gangs.gpus and g not in self.held_now:
                self.hold(g, j)
            self.used.add(g)
        why = {"trigger": "backfill" if backfill else "gang",
               "note": f"{j} on {len(gpus)} whole GPU(s)"
                       + (" until the reservation starts" if backfill else "")}
        self.out.append(StartGang(j, tuple(gpus), self.st.new_plan_id(), why=why))
        self.placed.add(j)


def with_gangs(policy: Policy, node_of: Callable[[str], str] = gpu_node) -> GangLayer:
    """``policy`` with gangs (:class:`GangLayer`)."""
    return GangLayer(policy, node_of)
