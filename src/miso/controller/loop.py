"""The event loop: the only thread that touches the scheduling state and the policy.

It takes items one at a time from the runtime's queue (events from the poller and the
executor, progress reports, user cancels, lost nodes) and the items due on the runtime's clock
(timers the policy asked for, lost nodes whose lease runs out later), and runs the shared driver
step (:class:`miso.sched.driver.DriverStep`: filter stale -> observe -> decide -> apply -> log),
handing each decision to the plan executor. It never blocks on an agent for long. No scheduling
choice is made here: every placement, layout, profiling run and requeue comes from the policy,
but the operator's rules on time limits (a job past its limit is ended, or requeued after its
checkpoint: :class:`~miso.sched.events.JobStopped`, :mod:`miso.controller.timelimits`).

:meth:`EventLoop.run_once` handles one item and whatever is due: tests drive it on a
:class:`~miso.sched.clock.VirtualClock` without the thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from miso.controller.executor import PlanExecutor
from miso.controller.loopdispatch import ItemDispatch
from miso.controller.loopqueue import (
    ARRIVAL_BATCH,
    GROUP_MAX,
    GROUPED,
    waiting_arrivals,
    waiting_group,
)
from miso.controller.loopstops import LoopStops
from miso.controller.loopview import LoopView
from miso.controller.loopwrites import EventLogBuffer, PlacedBuffer
from miso.controller.runtime import Runtime
from miso.jobstatus import LIMIT_REASON
from miso.sched import (
    ApplyLayout,
    ClusterState,
    ContractError,
    Decision,
    Event,
    JobFailed,
    JobFinished,
    PlaceJob,
    Policy,
    RequeueJob,
    RunMps,
    StartProfiling,
    WakeUp,
)
from miso.sched.decisions import RepartitionDeclined, StartGang, StopGang
from miso.sched.driver import DriverStep, batchable
from miso.sched.state import JobStatus
from miso.sched.tenancy import UsageRecord

log = logging.getLogger(__name__)

#: How often (s) the status snapshot is rebuilt while items wait in the queue (it is rebuilt
#: as soon as the queue is empty): a 1,000-GPU view costs ~25 ms on the 2-core machine, so a
#: burst of 10,000 submissions costs no 10,000 rebuilds.
SNAPSHOT_EVERY_S = 0.5

#: A loop that has not come round for this long (s, real time) is reported stuck.
STUCK_AFTER_S = 60.0

#: How often (s, real time) running jobs are checked against their time limits.
TIME_LIMIT_EVERY_S = 1.0

__all__ = ["ARRIVAL_BATCH", "GROUPED", "GROUP_MAX", "EventLoop"]


class EventLoop:
    """Drives ``policy`` over ``state`` (see the module docstring)."""

    def __init__(self, rt: Runtime, executor: PlanExecutor, policy: Policy,
                 policy_name: str) -> None:
        self.rt = rt
        self.executor = executor
        self.policy = policy
        self.policy_name = policy_name
        self.state = ClusterState(rt.cfg.tenancy)
        #: events and decisions not yet written to the store (see :meth:`flush_log`)
        self.events = EventLogBuffer(rt.store, rt.error)
        self.step = DriverStep(self.state, policy, execute=self._execute_step,
                               record=self.events.record, observer=rt.observer,
                               on_contract_error=self._contract_error)
        #: the status snapshot for readers (:mod:`miso.controller.loopview`)
        self.view = LoopView(rt, self.state, self.step)
        #: time limits, replica room and lost nodes (:mod:`miso.controller.loopstops`)
        self.stops = LoopStops(rt, self.state, executor, self._handle, self.step)
        #: each queue item to what handles its kind (:mod:`miso.controller.loopdispatch`)
        self.dispatch = ItemDispatch(rt, self.state, self.step, self.stops, self._handle)
        #: called with the tenancy ledger whenever an owner's charge changed (the controller
        #: keeps it in the store: :mod:`miso.controller.usagestore`)
        self.on_ledger: Callable[[list[UsageRecord]], None] | None = None
        self._rates: dict[str, float] = {}
        #: the kept events are written with the turn's placements (run_once)
        self._log_due = False
        #: placements not yet written to the store (one transaction per turn: loopwrites.py)
        self.placed = PlacedBuffer(rt.store, rt.error,
                                   lambda gpu, plan: self.executor.submit(gpu, plan))
        self._thread: threading.Thread | None = None
        #: real time the loop last came round, and why its thread ended (None: it has not)
        self.beat = time.monotonic()
        self.died: str | None = None
        self._limits_at = 0.0

    def start(self) -> None:
        self.beat = time.monotonic()
        self.died = None
        self._thread = threading.Thread(target=self._run, name="miso-loop", daemon=True)
        self._thread.start()

    def health(self) -> list[str]:
        """What is wrong with the loop thread (empty: it runs and comes round): dead while
        the controller is not stopping, or stuck on one item for :data:`STUCK_AFTER_S`."""
        if self._thread is None or self.rt.stopping.is_set():
            return []
        if not self._thread.is_alive():
            return [f"the scheduling loop is not running ({self.died or 'its thread ended'})"]
        late = time.monotonic() - self.beat
        if late > STUCK_AFTER_S:
            return [f"the scheduling loop is stuck: it has not come round for {late:.0f} s"]
        return []

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    @property
    def _gangs(self) -> Any:
        """The executor's gang runner (:mod:`miso.controller.gangs`); None for a test's
        stand-in executor."""
        return getattr(self.executor, "gangs", None)

    def make_room(self, job: str) -> None:
        """Ask the loop to checkpoint one running job so that ``job``, a queued replica job
        of the head (``ahead``), gets a slice (:func:`~miso.sched.replicaroom.room_victim`
        chooses it; nothing when none makes room: :meth:`LoopStops.make_room`). Any
        thread."""
        self.rt.queue.put(("make_room", job))

    def snapshot(self) -> dict[str, Any]:
        """GPUs (layout, phase, jobs) and the queue as of the last handled item."""
        return self.view.get()

    # ---- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        """Come round until the controller stops: an exception while handling one item is
        logged and shown in the errors, the item is dropped and the loop goes on."""
        try:
            while not self.rt.stopping.is_set():
                self.beat = time.monotonic()
                try:
                    self.run_once(timeout=0.5)
                except Exception as e:  # noqa: BLE001 - one bad item must not stop scheduling
                    log.exception("controller: the scheduling loop failed on one item")
                    self.rt.error(f"scheduling loop: {type(e).__name__}: {e} (item dropped; "
                                  "the loop goes on)")
                    time.sleep(0.1)  # a failure that repeats does not spin a core
            self.flush_log()
        except BaseException as e:  # noqa: BLE001 - recorded for health(); the thread ends
            self.died = f"{type(e).__name__}: {e}"
            log.critical("controller: the scheduling loop died: %s", self.died)

    def run_once(self, timeout: float = 0.0) -> bool:
        """Handle the clock's due items, then one queued item (waiting up to ``timeout``
        seconds of real time, cut short by the next timer); False when there was nothing.
        The decision records of the turn are written out at its end (``observer.batch``)."""
        rt = self.rt
        clock = rt.clock
        nxt = clock.next_at()
        if nxt is not None:
            timeout = max(0.0, min(timeout, nxt - clock.now()))
        try:
            item = rt.queue.get(timeout=timeout) if timeout > 0 else rt.queue.get_nowait()
        except queue.Empty:
            item = None
        batch = getattr(rt.observer, "batch", None)
        with batch() if batch is not None else contextlib.nullcontext():
            try:
                return self._turn(item)
            finally:  # the turn's placements and (when due) its log: one wait for the store
                log_due, self._log_due = self._log_due, False
                self.placed.flush(self.flush_log if log_due and self.events.rows else None)

    def _turn(self, item: tuple[Any, ...] | None) -> bool:
        """:meth:`run_once` after its wait: the due items, then ``item`` (None: none)."""
        rt = self.rt
        clock = rt.clock
        did = self.run_due()
        if self.stops.time_limits is not None and time.monotonic() - self._limits_at >= \
                TIME_LIMIT_EVERY_S:
            self._limits_at = time.monotonic()
            self.dispatch.safe(self.stops.check_time_limits)
        if item is not None and item[0] == "node_lost" and item[2] > time.time():
            # the lease (wall time: the agent reads it) runs out later: wait on our clock
            clock.at(clock.now() + (item[2] - time.time()), item)
            item = None
        if item is None:
            if not did and (self.view.fair_stale or self.view.stale):
                self._update_snapshot(fresh=True)  # idle: bring the views up to date
            if self.events.rows:
                self.flush_log()
            return did
        if item[0] == "event" and batchable(item[1]):
            self._arrivals([item, *waiting_arrivals(rt.queue)])
        elif item[0] in GROUPED:
            self._group([item, *waiting_group(rt.queue)])
        else:
            self.dispatch(item)
        # fresh as soon as the queue is empty; while items wait, at most every 0.5 s
        due = rt.queue.empty() or time.monotonic() - self.view.built_at >= SNAPSHOT_EVERY_S
        if item[0] != "progress":  # a job's progress changes no GPU, queue or owner view
            self.view.stale = True
        if self.view.stale and due:
            self._update_snapshot()
        if self.events.rows and due:
            self._log_due = True  # written with the turn's placements (run_once)
        self._keep_ledger()
        return True

    def _group(self, items: list[tuple[Any, ...]]) -> None:
        """Events and progress reports that waited together, each handled in order as
        alone, except that the policy's placement pass runs once, after the last
        (:meth:`DriverStep.group`): at a thousand GPUs and a deep queue a pass costs tens
        of milliseconds, and the loop that falls behind takes bigger groups, so its work
        per event shrinks as its queue grows instead of the queue growing without bound.
        Each event's wait is reported up to the group's end, when its decision is made."""
        if len(items) == 1:
            self.dispatch(items[0])
            return
        rt = self.rt
        t0 = time.monotonic()
        self.step.observer = rt.observer
        if any(it[0] != "progress" for it in items):  # else only jobs' progress: no view
            self.view.stale = True
        try:
            with self.step.group(rt.now):
                for it in items:
                    self.dispatch(it, timed=False)
        except Exception as e:  # noqa: BLE001 - the pass at the end failed: reported
            log.exception("controller: the placement pass after %d events failed", len(items))
            rt.error(f"{type(e).__name__}: {e}")
        self._report_waits(items, t0)

    def _arrivals(self, items: list[tuple[Any, ...]]) -> None:
        """Submissions taken together: one driver batch (:meth:`DriverStep.arrivals`: the
        policy places them in one pass after the last one, as the simulator does for
        arrivals at one instant with ``coalesce_arrivals``); each item's wait and the
        batch's handling time are reported as for one event."""
        if len(items) == 1:
            self.dispatch(items[0])
            return
        rt = self.rt
        t0 = time.monotonic()
        self.step.observer = rt.observer
        evs = [it[1] for it in items]
        try:
            self.step.arrivals(rt.now(), evs)
        except Exception as e:  # noqa: BLE001 - as for one item: reported, the loop goes on
            log.exception("controller: a batch of %d submissions failed", len(evs))
            rt.error(f"{type(e).__name__}: {e}")
            for ev in evs:  # the batch's submissions not reached yet: each alone
                if ev.job.id not in self.state.jobs:
                    self.dispatch.safe(self._handle, ev)
        self._report_waits(items, t0)

    def _report_waits(self, items: list[tuple[Any, ...]], t0: float) -> None:
        """Each timed event's wait before ``t0`` and the handling of the items taken with it
        (a group's or a batch's), as :class:`ItemDispatch` reports them for one event."""
        obs = self.rt.observer
        if obs is None:
            return
        took = time.monotonic() - t0
        for it in items:
            if it[0] == "event" and len(it) > 2:
                obs.on_timing("loop_lag", t0 - it[2])
                obs.on_timing("event_handling", took)

    def handle(self, item: tuple[Any, ...]) -> None:
        """Handle one queue item (``("event", ev, t)``, ``("progress", ...)``, ``("cancel",
        job, done)``, ``("node_lost", node, lease_end)``) now, whatever the clock says."""
        self.dispatch(item)
        self.placed.flush()
        self._update_snapshot()
        self.flush_log()
        self._keep_ledger()

    def run_due(self) -> bool:
        """Handle the items due on the clock (timers, deferred lost nodes)."""
        did = False
        for _, item in self.rt.clock.due():
            did = True
            self.dispatch(item)
        if did:
            self._update_snapshot()
            self.flush_log()
            self._keep_ledger()
        return did

    def _keep_ledger(self) -> None:
        """Hand the ledger to ``on_ledger`` when an owner's charge changed since the last
        time (between changes it follows exactly from the last one)."""
        ten = self.state.tenancy
        if ten is None or self.on_ledger is None or ten.in_use == self._rates:
            return
        try:
            self.on_ledger(ten.ledger())
        except Exception:  # noqa: BLE001 - the loop must survive a full disk; retried later
            log.exception("controller: keeping the owners' usage failed")
            return
        self._rates = dict(ten.in_use)

    def _handle(self, ev: Event) -> None:
        """One driver step for ``ev``; a job's end is made terminal in the store first.

        The placements kept are written after each step (below), so only a step that
        stopped short leaves some here: one that raised, a batch that failed part-way, or
        jobs a cancel released from their ``--after`` wait (``LoopStops.cancel``). They are
        written before this writes a job's end (loopwrites.py: rows change in the order
        decided); the others join this step's and are written with them."""
        st = self.state
        now = self.rt.now()
        if isinstance(ev, JobFinished | JobFailed):
            self.placed.flush()  # before the job's end (and its gang's) is written
            stored = ev.job in self.rt.finished_in_store  # the poller wrote it at the exit
            self.rt.finished_in_store.discard(ev.job)
            js = st.jobs.get(ev.job)
            if js is None or js.status in (JobStatus.FINISHED, JobStatus.FAILED):
                return
            if isinstance(ev, JobFinished):
                if not stored:
                    self.rt.store.finish(ev.job, JobStatus.FINISHED, at=now)
            else:
                self.rt.store.finish(ev.job, JobStatus.OVER_LIMIT if ev.reason.startswith(
                    LIMIT_REASON) else JobStatus.FAILED, reason=ev.reason, at=now)
            # a gang's other ranks end too
            if self._gangs is not None:
                self._gangs.end(ev.job, finished=isinstance(ev, JobFinished))
        self.step.observer = self.rt.observer
        self.step(now, ev)
        self.placed.flush()  # a caller (LoopStops) may write these jobs' rows next

    def flush_log(self) -> None:
        """Write the events and decisions kept since the last time, in one transaction."""
        self.events.flush()

    def _contract_error(self, now: float, d: Decision, e: ContractError) -> None:
        msg = f"policy {self.policy_name} broke the contract: {e}"
        log.error(msg)
        self.rt.error(msg)

    def _execute_step(self, now: float, d: Decision, ctx: Any) -> None:
        self._execute(d)

    def _execute(self, d: Decision) -> None:
        rt = self.rt
        if isinstance(d, PlaceJob | ApplyLayout | RunMps | StartProfiling):
            self.view.gpu_changed(d.gpu)
        if isinstance(d, PlaceJob):  # written with the turn's others (loopwrites.py)
            self.placed.add(d.job, d.gpu)
            return
        if isinstance(d, StartProfiling | ApplyLayout | RunMps):
            self.placed.hold(d.gpu, d)  # handed over once the placements are written
            return
        self.placed.flush()  # before a worker or this thread writes a placed job's row
        match d:
            case RequeueJob(job=j):
                with rt.lock:
                    run = rt.runs.get(j)
                g = run.gpu if run is not None else rt.store.get(j).gpu
                if not (g and self.executor.submit(g, d)):
                    rt.store.update(j, state=JobStatus.QUEUED, gpu=None, placement=None)
            case WakeUp(at=at, tag=tag):
                rt.clock.at(at, ("tick", tag))
            case RepartitionDeclined(job=j) if j:
                self.view.declined(d)
            case StartGang() | StopGang():
                if self._gangs is not None:
                    self._gangs.submit(d)

    def _update_snapshot(self, *, fresh: bool = False) -> None:
        self.view.update(fresh=fresh)
