"""The event loop: the only thread that touches the scheduling state and the policy.

It takes items one at a time from the runtime's queue (events from the poller and the
executor, user cancels, lost nodes) and timers the policy asked for, calls ``state.observe``,
``policy.decide`` and ``state.apply``, and hands each decision to the plan executor. It never
blocks on an agent for long. No scheduling choice is made here: every placement, layout,
profiling run and requeue comes from the policy object.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import logging
import queue
import threading
import time
from typing import Any

from miso.agent.agent import exit_record_path
from miso.controller.executor import PlanExecutor
from miso.controller.runtime import Runtime
from miso.controller.transport import NodeUnavailable
from miso.job import read_json
from miso.sched import (
    ApplyLayout,
    ClusterState,
    ContractError,
    Decision,
    Event,
    GpuRemoved,
    JobFailed,
    JobFinished,
    JobSpeedChanged,
    JobSubmitted,
    PlaceJob,
    Policy,
    RequeueJob,
    RunMps,
    SpeedObserved,
    StartProfiling,
    Tick,
    WakeUp,
)
from miso.sched.state import JobStatus

log = logging.getLogger(__name__)


def _ev_body(x: Any) -> dict[str, Any]:
    try:
        return dataclasses.asdict(x)
    except TypeError:
        return {"repr": repr(x)}


class EventLoop:
    """Drives ``policy`` over ``state`` (see the module docstring)."""

    def __init__(self, rt: Runtime, executor: PlanExecutor, policy: Policy,
                 policy_name: str) -> None:
        self.rt = rt
        self.executor = executor
        self.policy = policy
        self.policy_name = policy_name
        self.state = ClusterState()
        self._timers: list[tuple[float, int, str]] = []
        self._deferred: list[tuple[float, int, tuple[Any, ...]]] = []  # (wall time, seq, item)
        self._tseq = itertools.count()
        self._snapshot: dict[str, Any] = {"gpus": [], "queue": []}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="miso-loop", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def snapshot(self) -> dict[str, Any]:
        """GPUs (layout, phase, jobs) and the queue as of the last handled item."""
        with self.rt.lock:
            return dict(self._snapshot)

    # ---- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        rt = self.rt
        while not rt.stopping.is_set():
            timeout = 0.5
            if self._timers:
                timeout = max(0.0, min(timeout, self._timers[0][0] - rt.now()))
            if self._deferred:
                timeout = max(0.0, min(timeout, self._deferred[0][0] - time.time()))
            try:
                item = rt.queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            while self._timers and self._timers[0][0] <= rt.now():
                _, _, tag = heapq.heappop(self._timers)
                self._safe(self._handle, Tick(tag))
            if item is not None and item[0] == "node_lost" and item[2] > time.time():
                heapq.heappush(self._deferred, (item[2], next(self._tseq), item))
                item = None
            if item is None and self._deferred and self._deferred[0][0] <= time.time():
                item = heapq.heappop(self._deferred)[2]
            if item is None:
                continue
            kind = item[0]
            if kind == "event":
                t0 = time.monotonic()
                self._safe(self._handle, item[1])
                if rt.observer is not None and len(item) > 2:
                    rt.observer.on_timing("loop_lag", t0 - item[2])
                    rt.observer.on_timing("event_handling", time.monotonic() - t0)
            elif kind == "cancel":
                self._safe(self._cancel, item[1])
                item[2].set()
            elif kind == "node_lost":
                self._safe(self._node_lost, item[1])
            self._update_snapshot()

    def _safe(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - the loop must survive anything
            log.exception("controller: %s(%s) failed", getattr(fn, "__name__", fn), args)
            self.rt.error(f"{type(e).__name__}: {e}")

    def _handle(self, ev: Event) -> None:
        st = self.state
        store = self.rt.store
        now = self.rt.now()
        match ev:
            case JobFinished(job=j) | JobFailed(job=j):
                js = st.jobs.get(j)
                if js is None or js.status in (JobStatus.FINISHED, JobStatus.FAILED):
                    return
                if isinstance(ev, JobFinished):
                    store.finish(j, "finished", at=now)
                else:
                    store.finish(j, "failed", reason=ev.reason, at=now)
            case SpeedObserved(job=j) | JobSpeedChanged(job=j):
                js = st.jobs.get(j)
                if js is None or js.status is not JobStatus.RUNNING or js.gpu != ev.gpu:
                    return
            case JobSubmitted(job=spec) if spec.id in st.jobs:
                return
            case _:
                pass
        obs = self.rt.observer
        if obs is not None:
            obs.on_event(now, ev, st)
        st.observe(now, ev)
        store.log_event(now, type(ev).__name__, _ev_body(ev))
        decisions = self.policy.decide(now, ev, st)
        for d in decisions:
            try:
                st.apply(now, d)
            except ContractError as e:
                msg = f"policy {self.policy_name} broke the contract: {e}"
                log.error(msg)
                self.rt.error(msg)
                continue
            store.log_event(now, "decision:" + type(d).__name__, _ev_body(d))
            if obs is not None:
                obs.on_decision(now, d, st)
            self._execute(d)

    def _execute(self, d: Decision) -> None:
        rt = self.rt
        match d:
            case PlaceJob(job=j, gpu=g):
                rt.store.update(j, gpu=g)
            case StartProfiling(gpu=g) | ApplyLayout(gpu=g) | RunMps(gpu=g):
                self.executor.submit(g, d)
            case RequeueJob(job=j):
                with rt.lock:
                    run = rt.runs.get(j)
                g = run.gpu if run is not None else rt.store.get(j).gpu
                if not (g and self.executor.submit(g, d)):
                    rt.store.update(j, state="queued", gpu=None, placement=None)
            case WakeUp(at=at, tag=tag):
                heapq.heappush(self._timers, (at, next(self._tseq), tag))

    def _cancel(self, job: str) -> None:
        rt = self.rt
        if not rt.store.finish(job, "cancelled", reason="cancelled by user", at=rt.now()):
            return
        with rt.lock:
            run = rt.runs.get(job)
            if run is not None:
                run.stopping = True
        if run is not None:
            with contextlib.suppress(NodeUnavailable):
                rt.call(run.node, "kill", run.job, run.attempt)
        js = self.state.jobs.get(job)
        if js is not None and js.status not in (JobStatus.FINISHED, JobStatus.FAILED):
            self._handle(JobFailed(job, "cancelled"))

    def _node_lost(self, node: str) -> None:
        """The node's lease has run out (its guards killed its jobs): requeue its jobs, except
        those whose exit record says they finished."""
        rt = self.rt
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
            r.status = "finished" if done else "lost"
            rt.store.end_attempt(r.job, r.attempt, status=r.status, at=now,
                                 end_iteration=r.last.get("total") if done else
                                 r.last.get("iteration"),
                                 checkpoint_iteration=r.last.get("checkpoint_iteration"),
                                 start_iteration=r.last.get("start_iteration"))
            if done:
                rt.store.log_event(now, "lost-node-finish", {"job": r.job})
                self._handle(JobFinished(r.job))
        for g in gpus:
            self.executor.remove_gpu(g.id)
            for j in list(self.state.gpus[g.id].jobs) if g.id in self.state.gpus else []:
                rt.store.update(j, state="queued", gpu=None, placement=None, mps_pct=None)
            self._handle(GpuRemoved(g.id))
        with rt.lock:
            rt.fencing.discard(node)

    def _update_snapshot(self) -> None:
        gpus = []
        for gid, gs in self.state.gpus.items():
            ref = self.rt.gpus.get(gid)
            gpus.append({
                "id": gid, "node": ref.node if ref else "", "model": gs.model,
                "phase": str(gs.phase), "layout": [str(p) for p in gs.layout],
                "assignment": {j: str(p) for j, p in gs.assignment.items()},
                "mps_shares": dict(gs.mps_shares), "jobs": list(gs.jobs),
                "pending_plan": gs.pending_plan_id,
            })
        with self.rt.lock:
            self._snapshot = {"gpus": gpus, "queue": list(self.state.queue)}
