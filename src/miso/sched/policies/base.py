"""Shared machinery of the built-in policies: event dispatch, per-call scratch, feasibility."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache
from itertools import islice
from typing import Any

from miso.mig import Geometry
from miso.optimize import optimizer_for
from miso.sched.decisions import Decision, PlaceJob, RequeueCause, RequeueJob, WakeUp
from miso.sched.events import (
    Event,
    GpuAdded,
    GpuRemoved,
    JobFailed,
    JobFinished,
    JobSpeedChanged,
    JobStopped,
    JobSubmitted,
    LayoutApplied,
    LayoutFailed,
    ProfilingFinished,
    SpeedObserved,
    Tick,
)
from miso.sched.pinning import pinned_speeds
from miso.sched.policies.entitled import Entitled
from miso.sched.policies.framework import ENTITLEMENT, PREEMPT, Cycle, Filter, PostFilter, Profile
from miso.sched.policies.ordernote import order_note
from miso.sched.policies.preempt import DEFAULT_RESTART_S
from miso.sched.quotacap import capped_speeds
from miso.sched.services import ServiceSlicesChanged
from miso.sched.state import ClusterState


@cache
def _fit_signature(geom: Geometry, memory_gb: float) -> tuple[str, ...]:
    return tuple(p.name for p in geom.profiles if p.memory_gib + 1e-9 >= memory_gb)


_FITS: dict[tuple[Geometry, float], tuple[str, ...]] = {}


def fitting_profiles(geom: Geometry, memory_gb: float) -> tuple[str, ...]:
    """Profiles of ``geom`` with enough memory for the job (cached)."""
    got = _FITS.get((geom, memory_gb))
    if got is None:
        got = _FITS[(geom, memory_gb)] = _fit_signature(geom, round(memory_gb, 3))
    return got


@cache
def _feasible(geom: Geometry, sigs: tuple[tuple[str, ...], ...]) -> bool:
    if not sigs or any(not s for s in sigs):
        return bool(sigs) and all(sigs)
    opt = optimizer_for(geom)
    if len(sigs) > opt.max_jobs:
        return False
    return opt.try_solve({str(i): dict.fromkeys(s, 1.0) for i, s in enumerate(sigs)}) is not None


def sigs_feasible(geom: Geometry, sigs: tuple[tuple[str, ...], ...]) -> bool:
    """True when some valid layout gives each job its own instance among the profiles of its
    signature (``sigs``: one tuple of profile names per job)."""
    return _feasible(geom, tuple(sorted(sigs)))


def mix_feasible(geom: Geometry, memories: list[float]) -> bool:
    """True when some valid layout gives every job its own instance with enough memory."""
    sigs = tuple(sorted(fitting_profiles(geom, m) for m in memories))
    return _feasible(geom, sigs)


def signature(geom: Geometry, memories: list[float]) -> tuple[tuple[str, ...], ...]:
    """The jobs' fitting profiles, sorted: all that :func:`mix_feasible` depends on."""
    return tuple(sorted(fitting_profiles(geom, m) for m in memories))


def signature_feasible(geom: Geometry, sig: tuple[tuple[str, ...], ...],
                       add: tuple[str, ...]) -> bool:
    """:func:`mix_feasible` of the jobs of ``sig`` plus one job whose fitting profiles are
    ``add``."""
    return _feasible(geom, tuple(sorted((*sig, add))))


@cache
def fit_classes(geom: Geometry) -> tuple[tuple[str, ...], ...]:
    """Every distinct non-empty ``fitting_profiles(geom, m)`` over all memories ``m``."""
    return tuple(dict.fromkeys(fitting_profiles(geom, p.memory_gib) for p in geom.profiles))


class Scratch:
    """Decisions of the current ``decide`` call that the state does not show yet."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.out: list[Decision] = []
        self.extra: dict[str, list[str]] = {}    # gpu -> jobs placed during this call
        self.placed: set[str] = set()
        self.requeued: set[str] = set()
        self.touched: list[str] = []             # GPUs whose jobs changed during this call
        self._fair: Entitled | None = None
        #: GPUs reclaimed during this call -> the owner they were returned to
        self.reserved: dict[str, str] = {}
        self._cycle: Cycle | None = None

    @property
    def cycle(self) -> Cycle:
        """This call's facts (set by :meth:`BasePolicy.decide` before any hook runs; a
        scratch made outside ``decide``, in a test, gets a cycle with fair share's filter)."""
        if self._cycle is None:
            self._cycle = Cycle(self.state.now, Tick(), self.state, self,
                                (ENTITLEMENT,))
        return self._cycle

    @cycle.setter
    def cycle(self, cy: Cycle) -> None:
        self._cycle = cy

    @property
    def fair(self) -> Entitled:
        """Fair share's sizes as this call sees them (tenancy on; built on first use)."""
        if self._fair is None:
            self._fair = Entitled(self, sigs_feasible, fitting_profiles)
        return self._fair

    def owner_bound(self) -> bool:
        """Whether owners' entitlements restrict which GPU a job may join (:meth:`may_join`):
        then a job that fits nowhere says nothing about other owners' jobs."""
        ten = self.state.tenancy
        return ten is not None and ten.config.entitled

    def entitlements(self) -> dict[str, float]:
        """:meth:`Entitled.entitlements <miso.sched.policies.entitled.Entitled.entitlements>`."""
        return self.fair.entitlements()

    def entitled_mix(self, gpu: str, jobs: list[str]) -> bool:
        """:meth:`Entitled.mix <miso.sched.policies.entitled.Entitled.mix>`."""
        return self.fair.mix(gpu, jobs)

    def may_join(self, job: str, gpu: str) -> bool:
        """Whether ``job`` may be placed beside the jobs on ``gpu`` as this call sees them:
        always without entitlements; else :meth:`Entitled.may_join
        <miso.sched.policies.entitled.Entitled.may_join>`."""
        return not self.owner_bound() or self.fair.may_join(job, gpu)

    def entitled_speeds(self, gpu: str, speeds: dict[str, dict[str, float]]
                        ) -> dict[str, dict[str, float]]:
        """``speeds`` as the optimizer should see them: unchanged without entitlements; else
        :meth:`Entitled.speeds <miso.sched.policies.entitled.Entitled.speeds>`."""
        speeds = capped_speeds(self.state, gpu, speeds)  # in-use quotas are caps
        speeds = pinned_speeds(self.state, speeds)  # a job pinned to a profile (pinning.py)
        return speeds if not self.owner_bound() else self.fair.speeds(gpu, speeds)

    def jobs_on(self, gpu: str) -> list[str]:
        jobs = self.state.gpus[gpu].jobs
        base = [j for j in jobs if j not in self.requeued] if self.requeued else jobs[:]
        extra = self.extra.get(gpu)
        return base + extra if extra else base

    def memory_on(self, gpu: str) -> float:
        jobs = self.state.jobs
        return sum(jobs[j].spec.memory_gb for j in self.jobs_on(gpu))

    def place(self, job: str, gpu: str) -> None:
        self.out.append(PlaceJob(job, gpu, why=order_note(self.state, self.placed, job)))
        self.extra.setdefault(gpu, []).append(job)
        self.placed.add(job)
        self.touched.append(gpu)

    def requeue(self, job: str, reason: str, why: dict | None = None, *,
                cause: RequeueCause = RequeueCause.OTHER) -> None:
        self.out.append(RequeueJob(job, reason, cause, why=why))
        self.requeued.add(job)
        gpu = self.state.jobs[job].gpu
        if gpu is not None:
            self.touched.append(gpu)
        for g, placed in self.extra.items():
            if job in placed:       # placed during this call, then taken off again
                placed.remove(job)
                self.touched.append(g)

    def queue(self, limit: int | None = None) -> list[str]:
        """Queued jobs as this call sees them, FIFO (the first ``limit``); with tenancy on,
        in its order (priority, fair share) without the jobs held back by a quota."""
        if self.state.tenancy is not None:
            return self._tenant_queue()[:limit]
        if self.requeued:
            # Requeued jobs re-enter in submission order (jobs ahead first).
            q = sorted((set(self.state.queue) | self.requeued) - self.placed,
                       key=lambda x: self.state.jobs[x].queue_key)
            return q[:limit]
        if not self.placed:
            return self.state.queue[:limit]
        return list(islice((j for j in self.state.queue if j not in self.placed), limit))

    def iter_queue(self) -> Iterator[str]:
        """:meth:`queue`, lazily (no copy of a long queue for a loop that stops early); the
        caller may place the jobs it is given, nothing else, while it iterates."""
        if self.requeued or self.state.tenancy is not None:
            return iter(self.queue())
        placed = self.placed
        return (j for j in self.state.queue if j not in placed)

    def _tenant_queue(self) -> list[str]:
        """The tenancy order of the queue as this call sees it (placements and requeues of
        this call change owners' in-use quotas before the ledger sees them)."""
        st = self.state
        ten = st.tenancy
        assert ten is not None
        placed = self.placed
        cand = [j for j in st.queue if j not in placed]
        if self.requeued:
            cand = sorted(set(cand) | (self.requeued - placed),
                          key=lambda x: st.jobs[x].queue_key)
        extra: dict[str, float] = {}
        if ten.config.max_in_use:
            for j in placed:
                o = st.jobs[j].spec.owner
                extra[o] = extra.get(o, 0.0) + ten.smallest_charge(j)
            for j in self.requeued - placed:
                o = st.jobs[j].spec.owner
                extra[o] = extra.get(o, 0.0) - ten.charge_of(j)
        return ten.order(cand, extra)


class BasePolicy:
    """A policy's plan stage and the framework's cycle (:mod:`~miso.sched.policies.framework`):
    ``decide`` builds the :class:`~miso.sched.policies.framework.Cycle`, runs the ``before``
    post-filters, dispatches the event to ``on_*`` hooks (subclasses fill ``Scratch.out``),
    then the ``after`` post-filters."""

    name = "base"
    #: The profile's plugins (set by :class:`~miso.sched.policies.framework.Profile` when it
    #: builds the policy; these class defaults when the class is built directly).
    filters: tuple[Filter, ...] = ()
    post_filters: tuple[PostFilter, ...] = (PREEMPT,)
    profile: Profile | None = None
    #: when the pending reclaim timer fires (the reclaim post-filter's memory across calls)
    reclaim_timer: float | None = None
    #: tags of the timers set with :meth:`wake_once` that have not fired yet
    timers: frozenset[str] = frozenset()

    def decide(self, now: float, event: Event, state: ClusterState) -> list[Decision]:
        sc = Scratch(state)
        cy = sc.cycle = Cycle(now, event, state, sc, self.filters)
        if state.defer_capacity:  # a live group: post-filters run with the pass at its end
            if any(pf.active(self, cy) for pf in self.post_filters):
                state.capacity_owed = event
            self.dispatch(now, event, sc)
            return sc.out
        return self.post_filtered(now, cy, owed=False)

    def post_filtered(self, now: float, cy: Cycle, *, owed: bool) -> list[Decision]:
        """One cycle's pass with the post-filters around it: the ``before`` ones, the pass,
        the ``after`` ones; the cycle's decisions. The pass is the event's hook
        (:meth:`decide`; a ``before`` post-filter that freed room is followed by a placement
        pass at once) or, for the pass a group of events owed (:meth:`owed_pass`), the
        placement pass alone (it follows the ``before`` post-filters anyway)."""
        sc = cy.sc
        for pf in self.post_filters:
            if pf.when == "before" and pf.active(self, cy) and pf.run(self, cy) and not owed:
                self.on_capacity(now, sc)
        if owed:
            self.on_capacity(now, sc)
        else:
            self.dispatch(now, cy.event, sc)
        for pf in self.post_filters:
            if pf.when == "after" and pf.active(self, cy):
                pf.run(self, cy)
        return sc.out

    def capacity(self, now: float, sc: Scratch) -> None:
        """The event hooks' placement pass (:meth:`on_capacity`), or, while the live driver
        delivers a group of waiting events (``state.defer_capacity``), one pass owed to the
        group's end (:meth:`owed_pass`): a completion in a deep queue costs a pass over the
        queue's window, and twenty completions waiting together need one, not twenty."""
        st = sc.state
        if st.defer_capacity:
            st.capacity_owed = sc.cycle.event
            return
        self.on_capacity(now, sc)

    def owed_pass(self, now: float, state: ClusterState) -> list[Decision]:
        """The placement pass (with the post-filters) a group of events left to its end
        (:meth:`capacity`), in a cycle of the last event that owed it; nothing when none
        did."""
        ev = state.capacity_owed
        state.capacity_owed = None
        if ev is None:
            return []
        sc = Scratch(state)
        cy = sc.cycle = Cycle(now, ev, state, sc, self.filters)  # type: ignore[arg-type]
        return self.post_filtered(now, cy, owed=True)

    def dispatch(self, now: float, event: Event, sc: Scratch) -> None:
        """The event to its ``on_*`` hook (:data:`_HOOKS`; an event with none: nothing)."""
        hook = _HOOKS.get(type(event))
        if hook is not None:
            hook(self, now, event, sc)

    def wake_once(self, out: list[Decision], at: float, tag: str) -> None:
        """A timer (:class:`~miso.sched.decisions.WakeUp` ``tag`` at ``at``) unless one with
        ``tag`` is pending: a rule that asks again before it fires sets no second one (the
        tag is free again when its :class:`~miso.sched.events.Tick` is dispatched)."""
        if tag not in self.timers:
            self.timers = self.timers | {tag}
            out.append(WakeUp(at, tag))

    def has_room(self, sc: Scratch, job: str) -> bool:
        """Whether the policy could place ``job`` now (reclaim asks first)."""
        return True

    def restart_price(self, job: str) -> float:
        """What restarting ``job`` costs (s), the price preemption and reclaim charge for it:
        the post-filters' default for a policy without a restart economy."""
        return DEFAULT_RESTART_S

    def fits(self, cy: Cycle, job: str, gpu: str, residents: Sequence[str]) -> bool:
        """**The fit test**: ``job`` on ``gpu`` if only ``residents`` stayed there: the
        policy's :meth:`capacity_fit`, then every filter active in the cycle. Preemption and
        reclaim call it on the residents that would stay."""
        return self.capacity_fit(gpu, residents, job, cy.sc) and cy.allowed(job, gpu, residents)

    def capacity_fit(self, gpu: str, remaining: Sequence[str], job: str, sc: Scratch) -> bool:
        """The fit test's capacity part: True when this policy's partitioning of ``gpu`` holds
        ``job`` beside ``remaining`` (MIG policies: a valid layout holds the mix)."""
        st = sc.state
        gs = st.gpus[gpu]
        if len(remaining) + 1 > gs.geom.model.max_instances:
            return False
        return mix_feasible(gs.geom, [st.jobs[j].spec.memory_gb for j in (*remaining, job)])

    # hooks --------------------------------------------------------------------------------
    def on_submit(self, now: float, ev: JobSubmitted, sc: Scratch) -> None:
        if not sc.state.more_arrivals:  # else the batch's last submission places them all
            self.capacity(now, sc)

    def on_finish(self, now: float, job: str, gpu: str | None, sc: Scratch) -> None:
        self.capacity(now, sc)

    def on_profiled(self, now: float, ev: ProfilingFinished, sc: Scratch) -> None:
        pass

    def on_applied(self, now: float, gpu: str, sc: Scratch) -> None:
        pass

    def on_gpu_added(self, now: float, gpu: str, sc: Scratch) -> None:
        self.capacity(now, sc)

    def on_capacity(self, now: float, sc: Scratch) -> None:
        pass

    def on_slices_changed(self, now: float, gpu: str, sc: Scratch) -> None:
        """Service replicas took or gave back slices of ``gpu`` (:mod:`miso.sched.servicestate`)."""
        self.capacity(now, sc)

    def replan_later(self, gpu: str) -> None:
        """A post-filter changed ``gpu``'s residents: a policy that plans per GPU re-plans it
        before the call ends (the base policy plans nothing)."""

    def on_speed_changed(self, now: float, ev: JobSpeedChanged, sc: Scratch) -> None:
        pass

    def on_speed_observed(self, now: float, ev: SpeedObserved, sc: Scratch) -> None:
        pass

    def on_tick(self, now: float, ev: Tick, sc: Scratch) -> None:
        pass


# -- event -> hook ----------------------------------------------------------------------------
def _finished(p: BasePolicy, now: float, ev: JobFinished | JobFailed, sc: Scratch) -> None:
    p.on_finish(now, ev.job, sc.state.jobs[ev.job].gpu, sc)


def _profiled(p: BasePolicy, now: float, ev: ProfilingFinished, sc: Scratch) -> None:
    gs = sc.state.gpus.get(ev.gpu)
    if gs is not None and gs.applied_plan_id == ev.plan_id:
        p.on_profiled(now, ev, sc)


def _applied(p: BasePolicy, now: float, ev: LayoutApplied, sc: Scratch) -> None:
    gs = sc.state.gpus.get(ev.gpu)
    if gs is not None and gs.applied_plan_id == ev.plan_id:
        p.on_applied(now, ev.gpu, sc)


def _failed(p: BasePolicy, now: float, ev: LayoutFailed, sc: Scratch) -> None:
    gs = sc.state.gpus.get(ev.gpu)
    if gs is not None and gs.pending is None:
        for j in list(gs.jobs):
            sc.requeue(j, f"layout failed: {ev.reason}", cause=RequeueCause.LAYOUT_FAILED)
        p.capacity(now, sc)


def _tick(p: BasePolicy, now: float, ev: Tick, sc: Scratch) -> None:
    if ev.tag in p.timers:  # (a timer of wake_once fired: its tag is free again)
        p.timers = p.timers - {ev.tag}
    p.on_tick(now, ev, sc)


#: Each event type's hook: a plan acknowledgement only when it is the GPU's current plan.
_HOOKS: dict[type, Any] = {
    JobSubmitted: lambda p, now, ev, sc: p.on_submit(now, ev, sc),
    JobFinished: _finished,
    JobFailed: _finished,
    JobStopped: lambda p, now, ev, sc: p.on_finish(now, ev.job, ev.gpu, sc),  # room freed
    ProfilingFinished: _profiled,
    LayoutApplied: _applied,
    LayoutFailed: _failed,
    GpuAdded: lambda p, now, ev, sc: p.on_gpu_added(now, ev.gpu, sc),
    GpuRemoved: lambda p, now, ev, sc: p.capacity(now, sc),
    JobSpeedChanged: lambda p, now, ev, sc: p.on_speed_changed(now, ev, sc),
    SpeedObserved: lambda p, now, ev, sc: p.on_speed_observed(now, ev, sc),
    Tick: _tick,
    ServiceSlicesChanged: lambda p, now, ev, sc: p.on_slices_changed(now, ev.gpu, sc),
}
