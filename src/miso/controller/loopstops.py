"""The scheduling loop's stops: a running job stopped at its time limit (ended, or requeued
after its checkpoint: :class:`~miso.sched.events.JobStopped`), a running job checkpointed to
make room for a queued service replica of the head, and a lost node's jobs requeued once its
lease has run out. They run on the loop thread (:class:`~miso.controller.loop.EventLoop`
dispatches its queue items to them); a checkpoint or kill runs in a thread of its own, whose
end comes back to the loop as a queue item. No scheduling choice is made here: the core hears
the event that follows (through ``handle``: one driver step) and its policy decides.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from miso.attemptstatus import AttemptStatus
from miso.controller.executor import PlanExecutor
from miso.controller.runtime import Runtime
from miso.controller.timelimits import TimeLimitStore, run_time, time_limit_reason
from miso.job import read_json
from miso.nodeerrors import NodeUnavailable
from miso.nodewire import exit_record_path
from miso.sched import ClusterState, Event, GpuRemoved, JobFailed, JobFinished, JobStopped
from miso.sched.driver import DriverStep
from miso.sched.replicaroom import room_victim
from miso.sched.state import JobStatus

log = logging.getLogger(__name__)


class LoopStops:
    """The stops of one loop (see the module docstring); ``handle(ev)`` runs one driver
    step on the loop thread."""

    def __init__(self, rt: Runtime, state: ClusterState, executor: PlanExecutor,
                 handle: Callable[[Event], None], step: DriverStep) -> None:
        self.rt = rt
        self.state = state
        self.executor = executor
        self.handle = handle
        self.step = step
        #: jobs' time limits (the controller's :class:`TimeLimitStore`; None: none)
        self.time_limits: TimeLimitStore | None = None
        #: replica job -> the job being checkpointed to make room for it (:meth:`make_room`)
        self._rooms: dict[str, str] = {}

    @property
    def _gangs(self) -> Any:
        """The executor's gang runner (:mod:`miso.controller.gangs`); None for a test's
        stand-in executor."""
        return getattr(self.executor, "gangs", None)

    def cancel(self, job: str) -> None:
        """A user's cancel: the job is cancelled in the store, its attempt killed (every rank
        of a gang), and the core hears it failed."""
        rt = self.rt
        if not rt.store.finish(job, JobStatus.CANCELLED, reason="cancelled by user", at=rt.now()):
            return
        with rt.lock:
            run = rt.runs.get(job)
            if run is not None:
                run.stopping = True
        if run is not None:
            with contextlib.suppress(NodeUnavailable):
                rt.call(run.node, "kill", run.job, run.attempt)
        if self._gangs is not None:
            self._gangs.end(job, finished=False)  # every rank of a gang
        self.step.drop_held(rt.now(), job)  # held for --after: never delivered now
        js = self.state.jobs.get(job)
        if js is not None and js.status not in (JobStatus.FINISHED, JobStatus.FAILED):
            self.handle(JobFailed(job, "cancelled"))

    def check_time_limits(self) -> None:
        """Stop every running job past its time limit (:mod:`miso.controller.timelimits`):
        its attempt is checkpointed (or killed) off the loop, then it ends as failed."""
        assert self.time_limits is not None
        limits = self.time_limits.jobs()
        if not limits:
            return
        st = self.state
        self.time_limits.forget(j for j in limits if j not in st.jobs or st.jobs[j].status in
                                (JobStatus.FINISHED, JobStatus.FAILED))
        with self.rt.lock:
            runs = [r for r in self.rt.runs.values() if r.job in limits and not r.stopping]
        now = time.time()
        for r in runs:
            requeue = self.requeues_at_limit(r.job)
            used = now - r.launched if requeue else \
                run_time(self.rt.store.attempts(r.job), r.attempt, r.launched, now)
            if used < limits[r.job]:
                continue
            r.stopping = True
            reason = time_limit_reason(limits[r.job], used, requeue)
            log.info("job %s: %s", r.job, reason)
            threading.Thread(target=self.time_out, args=(r, reason, requeue),
                             name="miso-timeout", daemon=True).start()

    def requeues_at_limit(self, job: str) -> bool:
        """Whether ``job`` goes back to the queue at its time limit (the operator's
        ``time_limit_action`` "requeue", a job that saves, on one GPU) instead of ending. A
        job that has saved a checkpoint counts as saving while a new attempt starts up (the
        agent calls an attempt without a helper report yet uncheckpointable)."""
        js = self.state.jobs.get(job)
        if self.rt.cfg.time_limit_action != "requeue" or js is None or js.spec.gang:
            return False
        rec = self.rt.job(job)
        return js.spec.checkpointable or bool(rec is not None and rec.checkpoint_iteration)

    def time_out(self, run: Any, reason: str, requeue: bool = False,
                  kind: str = "time-limit-requeue") -> None:
        try:
            self.executor.launcher.stop([run])
        finally:
            self.rt.queue.put(("time_requeue", run.job, run.gpu, reason, kind) if requeue
                              else ("time_limit", run.job, reason))

    def make_room(self, job: str) -> None:
        """The victim is stopped after a checkpoint off the loop, then requeued (the core
        hears :class:`~miso.sched.events.JobStopped`) behind the replica, which the policy
        places in the room it leaves; it resumes from its checkpoint when placed again."""
        js = self.state.jobs.get(job)
        if js is None or not js.spec.ahead:
            return
        rt = self.rt
        with rt.lock:  # one job at a time for a replica: the last one still stopping
            if job in self._rooms and self._rooms[job] in rt.runs:
                return
        self._rooms = {r: v for r, v in self._rooms.items()
                       if r in self.state.queue}  # forget replicas placed or gone
        victim = room_victim(self.state, job)
        if victim is None:
            return
        with rt.lock:
            run = rt.runs.get(victim)
            if run is None or run.stopping:
                return
            run.stopping = True
        self._rooms[job] = victim
        reason = f"checkpointed to make room for service replica {job} ({js.spec.name})"
        log.info("job %s: %s", victim, reason)
        threading.Thread(target=self.time_out, args=(run, reason, True, "replica-room"),
                         name="miso-room", daemon=True).start()

    def time_requeue(self, job: str, gpu: str, reason: str,
                      kind: str = "time-limit-requeue") -> None:
        """A job stopped at its time limit after a checkpoint: back in the queue (the core
        hears :class:`~miso.sched.events.JobStopped`; the policy places it again, and it
        resumes from its checkpoint). A job that moved, ended or runs again meanwhile: left
        as it is."""
        rt = self.rt
        js = self.state.jobs.get(job)
        with rt.lock:
            again = rt.runs.get(job)
        if js is None or js.gpu != gpu or again is not None:
            return
        rt.store.update(job, state=JobStatus.QUEUED, gpu=None, placement=None, mps_pct=None)
        rt.store.log_event(rt.now(), kind, {"job": job, "gpu": gpu, "reason": reason})
        self.handle(JobStopped(job, gpu, reason))

    def node_lost(self, node: str) -> None:
        """The node's lease has run out (its guards killed its jobs): requeue its jobs, except
        those whose exit record says they finished."""
        rt = self.rt
        if node in rt.fencing and self._gangs is not None:
            # gangs with a rank there end whole (other nodes' ranks too) and wait requeued
            self._gangs.node_lost(node)
        with rt.lock:
            if node not in rt.fencing:
                return
            gpus = [g for g in rt.gpus.values() if g.node == node]
            runs = [r for r in rt.runs.values() if r.node == node]
            for r in runs:
                del rt.runs[r.job]
        now = rt.now()
        log.warning("node %s lost: %d GPUs, %d running jobs requeued", node, len(gpus),
                    len(runs))
        rt.store.log_event(now, "node-lost", {"node": node, "jobs": [r.job for r in runs]})
        for r in runs:
            r.done.set()
            rec = read_json(exit_record_path(rt.agent_dir(r.node), r.job, r.attempt))
            done = isinstance(rec, dict) and rec.get("returncode") == 0
            r.status = AttemptStatus.FINISHED if done else AttemptStatus.LOST
            rt.store.end_attempt(r.job, r.attempt, status=r.status, at=now,
                                 end_iteration=r.last.get("total") if done else
                                 r.last.get("iteration"),
                                 checkpoint_iteration=r.last.get("checkpoint_iteration"),
                                 start_iteration=r.last.get("start_iteration"))
            if done:
                rt.store.log_event(now, "lost-node-finish", {"job": r.job})
                self.handle(JobFinished(r.job))
        for g in gpus:
            self.executor.remove_gpu(g.id)
            gs = self.state.gpus.get(g.id) or self.state.gangs.gpus.get(g.id)
            for j in list(gs.jobs) if gs is not None else []:
                rt.store.update(j, state=JobStatus.QUEUED, gpu=None, placement=None, mps_pct=None)
            self.handle(GpuRemoved(g.id))
        with rt.lock:
            rt.fencing.discard(node)
