"""The driver step both drivers run for every event: observe -> decide -> apply -> log.

The simulator (:mod:`miso.sim.engine`) and the live controller (:mod:`miso.controller.loop`)
differ only in where events come from and how a decision is carried out; everything between
an event and the execution of its decisions is this one function, so the two cannot drift:

1. **filter** stale events (:func:`stale`): a second report of a job that already ended, a
   duplicate submission, a speed report for a job that has left the GPU it was measured on, a
   report of a replica or service the state does not know (:mod:`miso.sched.servicestate`);
2. **observe**: ``state.observe(now, ev)``; a :class:`~miso.sched.events.JobProgress` stops
   here (it is folded into the job's state, policies read it there; it is not a decision point);
3. **decide**: ``policy.decide(now, ev, state)``;
4. **apply** each decision in order: ``state.apply`` validates it; a decision that breaks the
   contract (:class:`~miso.sched.state.ContractError`, a policy bug) is skipped and reported
   through ``on_contract_error``, the others go on;
5. **log** (``record``) and **execute** (``execute``) it.

A submission naming jobs that have not ended (``JobSpec.after``) is held before step 2 and
run through the step when its last dependency ends (:mod:`miso.sched.dependencies`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from miso.jobstatus import CORE_ENDED
from miso.sched.decisions import Decision, RepartitionDeclined
from miso.sched.dependencies import Dependencies
from miso.sched.events import (
    Event,
    JobFailed,
    JobFinished,
    JobProgress,
    JobSpeedChanged,
    JobStopped,
    JobSubmitted,
    SpeedObserved,
)
from miso.sched.policy import Policy
from miso.sched.services import SERVICE_EVENTS
from miso.sched.state import ClusterState, ContractError


def stale(ev: Event, state: ClusterState) -> bool:
    """True for an event that no longer means anything to the state (see the module
    docstring); drivers drop it before ``observe``."""
    match ev:
        case JobFinished(job=j) | JobFailed(job=j) | JobProgress(job=j):
            js = state.jobs.get(j)
            return js is None or js.status in CORE_ENDED
        case JobSubmitted(job=spec):
            return spec.id in state.jobs
        case JobStopped(job=j, gpu=g):  # moved or ended since it was stopped
            js = state.jobs.get(j)
            return js is None or js.status in CORE_ENDED or js.gpu != g or g not in state.gpus
        case SpeedObserved(job=j, gpu=g) | JobSpeedChanged(job=j, gpu=g):
            js = state.jobs.get(j)
            return js is None or js.status in CORE_ENDED or js.gpu != g
        case _ if isinstance(ev, SERVICE_EVENTS):
            return state.services.stale(ev)
    return False


def batchable(ev: Event) -> bool:
    """Whether ``ev`` may be delivered in a batch of one instant's submissions
    (:meth:`DriverStep.arrivals`): a single-GPU job's submission naming no dependencies."""
    return isinstance(ev, JobSubmitted) and not ev.job.gang and not ev.job.after


class DriverStep:
    """One driver's step over its ``state`` and ``policy`` (see the module docstring).

    Hooks (all optional): ``observer`` (``on_event`` before observe, ``on_decision`` after
    apply: :class:`miso.observe.Observer`), ``record(now, item)`` for every event and applied
    decision, ``before(now, d)`` called before ``apply`` (returns a context handed to
    ``execute``; the simulator reads a job's GPU there before a requeue clears it),
    ``execute(now, d, ctx)``, and ``on_contract_error(now, d, err)``.
    """

    def __init__(self, state: ClusterState, policy: Policy, *,
                 execute: Callable[[float, Decision, Any], None],
                 before: Callable[[float, Decision], Any] | None = None,
                 record: Callable[[float, object], None] | None = None,
                 observer: Any = None,
                 on_contract_error: Callable[[float, Decision, ContractError], None]
                 | None = None) -> None:
        self.state = state
        self.policy = policy
        self.execute = execute
        self.before = before
        self.record = record
        self.observer = observer
        self.on_contract_error = on_contract_error
        self.events = 0
        self.decisions = 0
        self.errors: list[str] = []
        if state.tenancy is not None:  # in-use quotas count the slices this policy gives
            state.tenancy.whole_gpus = bool(getattr(policy, "whole_gpus_only", False))
        #: submissions held until the jobs they name in ``after`` ended (``--after``)
        self.dependencies = Dependencies()

    def fold(self, now: float, ev: JobProgress) -> None:
        """Fold a progress report into the state (no decision point)."""
        js = self.state.jobs.get(ev.job)
        if js is None or js.status in CORE_ENDED:
            return
        self.state.observe(now, ev)
        if self.record is not None:
            self.record(now, ev)

    def __call__(self, now: float, ev: Event) -> bool:
        """Run the step for ``ev``; False when the event was dropped as stale."""
        st = self.state
        if isinstance(ev, JobProgress):
            self.fold(now, ev)
            return True
        if stale(ev, st):
            return False
        if isinstance(ev, JobSubmitted) and self.dependencies.waits(ev, st):
            return True  # not eligible yet: delivered once its dependencies ended
        self.deliver(now, ev)
        if isinstance(ev, JobFinished | JobFailed):
            for held in self.dependencies.released(st):
                self(now, held)  # its last dependency ended: it arrives now
        return True

    def arrivals(self, now: float, evs: list[JobSubmitted]) -> None:
        """Run the step for several submissions of one instant as one batch: each is
        filtered, observed and decided in order, but the policy is told how many are still
        to come (``state.more_arrivals``) and how many the batch holds
        (``state.batch_arrivals``), so it leaves its placement pass to the last one, which
        looks that many more jobs down the queue. A batch of one is exactly ``self(now, ev)``.

        Both drivers use it the same way, so they agree on a batch: the simulator for
        arrivals at the same instant when ``coalesce_arrivals`` is on, the live loop for the
        submissions already waiting in its queue when it takes one (one decision for those
        that arrived while the last one ran). Gang jobs are not batched (the gang layer
        places them itself) nor are jobs that name others in ``after`` (:func:`batchable`);
        a batch holding one of those is delivered one event at a time."""
        st = self.state
        if not all(batchable(ev) for ev in evs):
            for ev in evs:
                self(now, ev)
            return
        ready: list[JobSubmitted] = []
        seen: set[str] = set()
        for ev in evs:  # the ones that reach the policy: new (a duplicate is stale)
            if not stale(ev, st) and ev.job.id not in seen:
                seen.add(ev.job.id)
                ready.append(ev)
        st.batch_arrivals = len(ready)
        try:
            for i, ev in enumerate(ready):
                st.more_arrivals = len(ready) - 1 - i
                self.deliver(now, ev)
        finally:
            st.more_arrivals, st.batch_arrivals = 0, 1

    @contextmanager
    def group(self, now: Callable[[], float]) -> Iterator[None]:
        """Steps run inside are one group (the live loop's events that waited in its queue
        together): each event is filtered, observed and decided in order, but a policy that
        knows ``state.defer_capacity`` leaves its placement pass (and post-filters) to the
        group's end, where it runs once (``policy.owed_pass``) at ``now()``. The simulator
        never groups, so its decisions are those of one event at a time."""
        st = self.state
        st.defer_capacity = True
        try:
            yield
        finally:
            st.defer_capacity = False
            owed = getattr(self.policy, "owed_pass", None)
            try:
                if st.capacity_owed is not None and owed is not None:
                    t = now()
                    self.carry_out(t, owed(t, st))
            finally:
                st.capacity_owed = None

    def deliver(self, now: float, ev: Event) -> None:
        """Steps 2-5 for an event that is neither stale nor held."""
        st = self.state
        self.events += 1
        obs = self.observer
        if obs is not None:
            obs.on_event(now, ev, st)
        st.observe(now, ev)
        if self.record is not None:
            self.record(now, ev)
        self.carry_out(now, self.policy.decide(now, ev, st))

    def drop_held(self, now: float, job: str) -> bool:
        """Forget ``job``, held for its dependencies (cancelled before it was eligible);
        the jobs held only behind it are then delivered. True when it was held."""
        if not self.dependencies.forget(job):
            return False
        for held in self.dependencies.released(self.state):
            self(now, held)
        return True

    def carry_out(self, now: float, decisions: list[Decision]) -> None:
        """Steps 4-5 for each of the policy's decisions, in order."""
        st = self.state
        obs = self.observer
        for d in decisions:
            ctx = self.before(now, d) if self.before is not None else None
            try:
                st.apply(now, d)
            except ContractError as e:
                msg = f"policy {self.policy.name} broke the contract: {e}"
                self.errors.append(msg)
                del self.errors[:-100]
                if self.on_contract_error is not None:
                    self.on_contract_error(now, d, e)
                continue
            if not isinstance(d, RepartitionDeclined):  # a record: it decides nothing
                self.decisions += 1
            if obs is not None:
                obs.on_decision(now, d, st)
            if self.record is not None:
                self.record(now, d)
            self.execute(now, d, ctx)
