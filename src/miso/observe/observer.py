"""The observer a driver (live controller or simulator) calls while it runs the scheduling core.

Three calls, in the driver's event loop (see the contract in :mod:`miso.sched`):

* ``on_event(now, ev, state)`` just *before* ``state.observe(now, ev)`` (the state still shows
  what the event changes: the pending plan an ack answers, the jobs of a GPU that is removed);
* ``on_decision(now, d, state)`` just *after* ``state.apply(now, d)`` and before executing it;
* ``on_timing(name, seconds)`` from any thread, for durations the driver measures
  (``checkpoint``, ``loop_lag``, ``event_handling``).

From these it keeps the Prometheus counters and histograms (:class:`~miso.observe.metrics.Metrics`)
and writes one explanation record per decision (:mod:`~miso.observe.decisions`) to the
decision log (:class:`~miso.observe.eventlog.DecisionLog`). Either part may be left out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from miso.mig import Placement
from miso.observe.decisions import Context, explain, name_owners, trigger_of
from miso.observe.eventlog import LOG_NAME, DecisionLog
from miso.observe.metrics import Metrics
from miso.sched import (
    ApplyLayout,
    ClusterState,
    Decision,
    Event,
    GpuAdded,
    GpuRemoved,
    JobFailed,
    JobFinished,
    JobStatus,
    LayoutApplied,
    LayoutFailed,
    PlaceJob,
    ProfilingFinished,
    RequeueJob,
    RunMps,
    SpeedObserved,
    StartProfiling,
)
from miso.sched.decisions import StartGang, StopGang

logger = logging.getLogger(__name__)

Estimates = Callable[[], Mapping[str, Mapping[str, float]] | None]

_RESTART_REASON = {StartProfiling: "profiling", ApplyLayout: "repartition",
                   RunMps: "repartition", RequeueJob: "preemption"}


def policy_estimates(policy: Any) -> Estimates:
    """The predicted-speed table of a built-in MISO-like policy (its public ``est``), used
    when a decision carries no ``why``; an empty table for other policies."""
    return lambda: getattr(policy, "est", None)


class Observer:
    """Metrics and decision log of one driver. Not thread-safe except :meth:`on_timing`:
    ``on_event``/``on_decision`` come from the driver's single loop thread."""

    def __init__(self, metrics: Metrics | None = None, log: DecisionLog | None = None, *,
                 estimates: Estimates | None = None,
                 owner_names: Mapping[str, str] | None = None) -> None:
        self.metrics = metrics
        self.owner_names = owner_names if owner_names is not None else {}
        self.log = log
        self.estimates = estimates
        self._event: Event | None = None
        self._issued: dict[str, tuple[int, float]] = {}  # gpu -> (its latest plan, when)
        self._restarts: dict[str, int] = {}          # job -> restarts seen in the state
        self._started: set[str] = set()              # jobs a plan has run at least once
        self._gpu_of: dict[str, str] = {}            # job -> GPU it was placed on
        self._origin: dict[str, str] = {}            # gpu -> words on what started its plan
        self._predicted: dict[str, dict[str, float]] = {}   # job -> profile -> speed
        self._speed: dict[str, dict[str, float | None]] = {}  # job -> observed/predicted
        self._lock = threading.Lock()
        self._removed: set[str] = set()              # GPUs that left (a GpuAdded: back)
        #: Why a GPU's node was lost (the controller's words), for the decision log.
        self.lost_why: Callable[[str], str | None] = lambda _gpu: None

    def batch(self) -> AbstractContextManager[None]:
        """Decision records of a driver's turn written out once, at its end
        (:meth:`DecisionLog.batch`)."""
        return self.log.batch() if self.log is not None else nullcontext()

    # ---- hooks ----------------------------------------------------------------------------

    def on_event(self, now: float, ev: Event, state: ClusterState) -> None:
        """Called before ``state.observe(now, ev)``. Never raises: a fault here is logged and
        the driver goes on (watching must not stop scheduling)."""
        self._event = ev
        try:
            self._on_event(now, ev, state)
        except Exception:  # noqa: BLE001
            logger.exception("observer: %s at t=%.1f", type(ev).__name__, now)

    def on_decision(self, now: float, d: Decision, state: ClusterState) -> None:
        """Called after ``state.apply(now, d)``. Never raises (see :meth:`on_event`)."""
        try:
            self._on_decision(now, d, state)
        except Exception:  # noqa: BLE001
            logger.exception("observer: %s at t=%.1f", type(d).__name__, now)

    def _on_event(self, now: float, ev: Event, state: ClusterState) -> None:
        m = self.metrics
        if m is not None:
            m.events.labels(type(ev).__name__).inc()
        match ev:
            case JobFinished(job=j) | JobFailed(job=j):
                js = state.jobs.get(j)
                if js is not None and js.status not in (JobStatus.FINISHED, JobStatus.FAILED):
                    ok = isinstance(ev, JobFinished)
                    if m is not None:
                        m.completed.labels("finished" if ok else "failed").inc()
                        if ok:
                            m.jct_s.observe(max(0.0, now - js.submitted_at))
                        else:
                            m.failures.labels("job").inc()
                for d in (self._restarts, self._gpu_of, self._predicted):
                    d.pop(j, None)
                self._started.discard(j)
                with self._lock:
                    self._speed.pop(j, None)
            case GpuRemoved(gpu=g):
                gs = state.gpus.get(g)
                if gs is not None:
                    lost = [j for j in gs.jobs if state.jobs[j].status is JobStatus.RUNNING]
                    if lost and m is not None:
                        m.restarts.labels("node_loss").inc(len(lost))
                    self._removed.add(g)
                    if self.log is not None:
                        self.log.append(gpu_lost_record(now, g, list(gs.jobs), lost,
                                                        self.lost_why(g)))
            case GpuAdded(gpu=g) if g in self._removed:
                self._removed.discard(g)
                if self.log is not None:
                    self.log.append({"time": round(now, 3), "kind": "GpuJoined", "gpu": g,
                                     "trigger": "node_change",
                                     "cause": {"event": "GpuAdded", "gpu": g},
                                     "note": f"{g} joined again (its agent is back); the "
                                             f"policy places jobs on it anew"})
            case LayoutApplied(gpu=g, plan_id=pid):
                gs = state.gpus.get(g)
                if gs is not None and gs.pending_plan_id == pid and m is not None:
                    t0 = self._issued_at(g, pid)
                    if t0 is not None:
                        m.reconfig_s.observe(max(0.0, now - t0))
                    d = gs.pending
                    full = Placement(0, gs.geom.model.full_profile().name)
                    new = tuple(sorted(d.layout)) if isinstance(d, ApplyLayout) else (full,)
                    if new != tuple(sorted(gs.layout)):
                        m.reconfigurations.inc()
            case LayoutFailed(gpu=g, plan_id=pid):
                gs = state.gpus.get(g)
                if gs is not None and gs.pending_plan_id == pid:
                    self._issued_at(g, pid)
                    if m is not None:
                        m.failures.labels("layout").inc()
            case ProfilingFinished(gpu=g, plan_id=pid):
                gs = state.gpus.get(g)
                if gs is not None and gs.pending_plan_id == pid:
                    t0 = self._issued_at(g, pid)
                    if t0 is not None and m is not None:
                        m.profiling_s.observe(max(0.0, now - t0))
            case SpeedObserved():
                self._speed_observed(ev, state)
            case _:
                pass

    def _on_decision(self, now: float, d: Decision, state: ClusterState) -> None:
        m = self.metrics
        if m is not None:
            m.decisions.labels(type(d).__name__).inc()
        involved = _jobs_of(d)
        restarted = []
        for j in involved:
            js = state.jobs.get(j)
            if js is None:
                continue
            if js.restarts > self._restarts.get(j, 0):
                restarted.append(j)
            self._restarts[j] = js.restarts
        if m is not None and restarted:
            m.restarts.labels(_RESTART_REASON.get(type(d), "repartition")).inc(len(restarted))
        pid = getattr(d, "plan_id", None)
        if pid is not None:  # a newer plan supersedes the GPU's pending one
            for g in getattr(d, "gpus", None) or (d.gpu,):  # type: ignore[attr-defined]
                self._issued[g] = (pid, now)  # a gang's plan: on each of its GPUs
        if isinstance(d, (StartProfiling, ApplyLayout, RunMps, StartGang)):
            for j in involved:
                if j not in self._started:
                    self._started.add(j)
                    js = state.jobs.get(j)
                    if js is not None and m is not None:
                        m.queueing_s.observe(max(0.0, now - js.submitted_at))
        gpu_before = self._gpu_of.get(d.job) if isinstance(d, RequeueJob) else None
        if isinstance(d, PlaceJob):
            self._gpu_of[d.job] = d.gpu
        elif isinstance(d, RequeueJob):
            self._gpu_of.pop(d.job, None)
        speeds = self._speeds_for(d)
        if isinstance(d, ApplyLayout) and speeds:
            for j in d.assignment:
                if j in speeds:
                    self._predicted[j] = dict(speeds[j])
        if self.log is None:
            return
        gpu = getattr(d, "gpu", None)
        origin = self._origin.get(gpu) if gpu and isinstance(d, (ApplyLayout, RunMps)) \
            else None
        ctx = Context(event=self._event, restarted=restarted, speeds=speeds, origin=origin,
                      gpu_before=gpu_before)
        self.log.append(name_owners(explain(now, d, state, ctx), self.owner_names))
        self._track_origin(now, d)

    def on_timing(self, name: str, seconds: float) -> None:
        """A duration measured by the driver (any thread)."""
        if self.metrics is not None:
            self.metrics.timing(name, seconds)

    # ---- read side ------------------------------------------------------------------------

    def job_speeds(self) -> dict[str, dict[str, float | None]]:
        """job -> {"observed": relative speed seen on its slice, "predicted": ...}."""
        with self._lock:
            return {j: dict(v) for j, v in self._speed.items()}

    # ---- internals ------------------------------------------------------------------------

    def _issued_at(self, gpu: str, pid: int) -> float | None:
        """When plan ``pid`` of ``gpu`` was decided (None if superseded); forgets it."""
        got = self._issued.get(gpu)
        if got is None or got[0] != pid:
            return None
        del self._issued[gpu]
        return got[1]

    def _speeds_for(self, d: Decision) -> Mapping[str, Mapping[str, float]] | None:
        why = getattr(d, "why", None)
        if isinstance(why, Mapping) and why.get("speeds"):
            return why["speeds"]  # type: ignore[no-any-return]
        if self.estimates is None:
            return None
        try:
            est = self.estimates()
        except Exception:  # noqa: BLE001 - explanations must never break the driver
            return None
        if not est:
            return None
        jobs = _jobs_of(d)
        return {j: dict(est[j]) for j in jobs if j in est}

    def _track_origin(self, now: float, d: Decision) -> None:
        ev = self._event
        if isinstance(d, StartProfiling):
            trig, cause = trigger_of(ev)
            if "job" in cause and trig in ("arrival", "completion"):
                what = f"the {trig} of job {cause['job']}"
            else:
                what = f"a {trig.replace('_', ' ')} event"
            self._origin[d.gpu] = f"profiling the mix, started by {what} at t={now:.1f}s"
        elif isinstance(d, (ApplyLayout, RunMps)):
            self._origin.pop(d.gpu, None)

    def _speed_observed(self, ev: SpeedObserved, state: ClusterState) -> None:
        js = state.jobs.get(ev.job)
        gs = state.gpus.get(ev.gpu)
        if js is None or gs is None:
            return
        full = gs.geom.model.full_profile().name
        ref = js.observed.get(full)
        if ev.placement.profile == full:
            ref = ref or ev.rate
        if ref is None and js.mps_profile:
            ref = js.mps_profile[0]  # rate at 100 % MPS in its mix: an approximation
        pred = self._predicted.get(ev.job, {}).get(ev.placement.profile)
        obs = ev.rate / ref if ref else None
        with self._lock:
            self._speed[ev.job] = {"observed": obs, "predicted": pred,
                                   "profile": ev.placement.profile}  # type: ignore[dict-item]
        if obs is not None and pred and self.metrics is not None and \
                ev.placement.profile != full:
            self.metrics.predictor_error.observe(abs(obs - pred) / pred)


def _jobs_of(d: Decision) -> list[str]:
    match d:
        case ApplyLayout():
            return list(d.assignment)
        case StartProfiling():
            return list(d.jobs)
        case RunMps():
            return list(d.shares)
        case PlaceJob() | RequeueJob() | StartGang() | StopGang():
            return [d.job]
    return []


def metrics_source(controller: Any) -> Any:
    """What the metrics read at each scrape: the cluster view and every job's state, owner
    and submission time (``store.brief()``: no ``why`` line built per job, so a scrape stays
    cheap at 10,000 jobs), or the full ``status()`` of a controller without them."""
    store = getattr(controller, "store", None)
    if not hasattr(controller, "cluster") or not hasattr(store, "brief"):
        return controller.status

    reads = getattr(store, "reads", store)  # the read connection: not behind the writers

    def snapshot() -> dict[str, Any]:
        return {**controller.cluster(), "jobs": reads.brief()}
    return snapshot


def gpu_lost_record(now: float, gpu: str, jobs: list[str], running: list[str],
                    why: str | None) -> dict[str, Any]:
    """The decision-log record of a GPU that left (its node lost, e.g. its agent restarted):
    which jobs it held and that they go back to the queue to resume from a checkpoint."""
    held = (f"its job{'s' if len(jobs) != 1 else ''} {', '.join(jobs)} go back to the queue "
            f"and resume from their last checkpoint" if jobs else "it held no job")
    return {"time": round(now, 3), "kind": "GpuLost", "gpu": gpu, "trigger": "node_change",
            "cause": {"event": "GpuRemoved", "gpu": gpu}, "jobs": jobs, "restarts": running,
            "note": f"{gpu} left the cluster" + (f": {why}" if why else "") + f"; {held}"}


def attach(controller: Any, state_dir: str | Path | None = None, *, metrics: bool = True,
           log: bool = True) -> Observer:
    """Give a live :class:`~miso.controller.Controller` its observer: a metrics registry over
    its ``status()`` and the decision log ``<state_dir>/decisions.jsonl`` (in memory only when
    ``state_dir`` is None). Call before ``controller.start()``."""
    m = Metrics(status=metrics_source(controller)) if metrics else None
    dlog = None
    if log:
        dlog = DecisionLog(Path(state_dir) / LOG_NAME if state_dir is not None else None)
    obs = Observer(m, dlog, estimates=policy_estimates(controller.policy),
                   owner_names=getattr(controller, "owner_names", None))
    rt = getattr(controller, "rt", None)
    if rt is not None and isinstance(getattr(rt, "lost", None), dict):
        def lost_why(gpu: str) -> str | None:
            d = rt.lost.get(gpu.rpartition("/")[0]) or {}
            return str(d["why"]) if d.get("why") else None
        obs.lost_why = lost_why
    controller.observer = obs
    return obs
