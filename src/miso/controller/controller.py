"""The live controller: the shared scheduling core (:mod:`miso.sched`) driving real agents.

Threads:

* the **loop** thread owns the :class:`~miso.sched.ClusterState` and the policy. It takes events
  one at a time from a queue (job submitted/finished/failed, acks of plans, speeds, timers,
  node changes), calls ``state.observe``, ``policy.decide``, ``state.apply`` and hands each
  decision to the executor. It never blocks on an agent for long.
* the **poll** thread asks every agent for its report every ``poll_interval`` seconds, records
  progress in the store and turns process exits, steady rates and speed changes into events;
  an unreachable agent becomes a lost node (its GPUs are removed, its jobs requeued from their
  last checkpoints).
* one **worker** thread per GPU executes that GPU's plans in order (a newer plan supersedes a
  queued older one): checkpoint the jobs that move (ask, wait ``checkpoint_timeout``, then kill),
  reconfigure through the agent, restart the jobs on their new instances, and acknowledge with
  ``LayoutApplied`` / ``LayoutFailed`` / ``ProfilingFinished``. Jobs whose instance is kept keep
  running (:func:`miso.mig.plan_transition`).

No scheduling choice is made here: every placement, layout, profiling run and requeue comes from
the policy object. A failed reconfiguration leaves the GPU empty (a known valid layout) with its
jobs checkpointed, as the core's contract says, and the policy requeues them.

Recovery: on start the controller reads its store, asks every agent what still runs, records
jobs that finished while it was down, checkpoints and stops the others, clears the GPUs and
re-submits every unfinished job to a fresh scheduling state (they resume from checkpoints).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import inspect
import itertools
import logging
import queue
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miso.agent.agent import layout_data, placement_of
from miso.controller.estimators import make_estimator
from miso.controller.store import JobStore, StoreError
from miso.controller.transport import NodeUnavailable, Transport
from miso.mig import (
    GPU_MODELS,
    Geometry,
    Placement,
    TransitionError,
    geometry,
    plan_transition,
)
from miso.sched import (
    ApplyLayout,
    ClusterState,
    ContractError,
    Decision,
    Event,
    GpuAdded,
    GpuRemoved,
    JobFailed,
    JobFinished,
    JobSpec,
    JobSpeedChanged,
    JobSubmitted,
    LayoutApplied,
    LayoutFailed,
    PlaceJob,
    ProfilingFinished,
    RequeueJob,
    RunMps,
    SpeedObserved,
    StartProfiling,
    Tick,
    WakeUp,
    make_policy,
)
from miso.sched.state import JobStatus
from miso.workloads import catalogue

log = logging.getLogger(__name__)


class SubmitError(ValueError):
    """A job was refused at submission (clear message for the user)."""


@dataclass
class ControllerConfig:
    """Knobs of the live controller. Times in seconds."""

    policy: str = "miso"
    policy_args: dict[str, Any] = field(default_factory=dict)
    estimator: str = "auto"
    poll_interval: float = 0.2
    checkpoint_timeout: float = 10.0
    call_timeout: float = 30.0
    profile_seconds_per_level: float = 10.0
    profile_warmup_s: float = 0.3
    reprofile_cooldown_s: float = 600.0
    discover_interval: float = 2.0
    node_failures_to_lose: int = 2
    check_commands: bool = True


@dataclass
class GpuRef:
    id: str
    node: str
    index: int
    model: str
    geom: Geometry


@dataclass
class Run:
    """The live attempt of a job."""

    job: str
    attempt: int
    node: str
    gpu: str
    index: int
    placement: Placement
    mps_pct: int | None
    launched: float
    stopping: bool = False
    status: str = "running"
    last: dict[str, Any] = field(default_factory=dict)
    observed_sent: bool = False
    change_seq_sent: int = 0
    done: threading.Event = field(default_factory=threading.Event)


def _ev_body(x: Any) -> dict[str, Any]:
    try:
        return dataclasses.asdict(x)
    except TypeError:
        return {"repr": repr(x)}


class Controller:
    """Controller over a :class:`JobStore` and a transport to agents. See the module docstring."""

    def __init__(self, store: JobStore, transport: Transport,
                 config: ControllerConfig | None = None, *,
                 checkpoint_root: str | Path | None = None) -> None:
        self.store = store
        self.transport = transport
        self.cfg = config or ControllerConfig()
        root = checkpoint_root or (Path(store.path).parent / "checkpoints"
                                   if store.path != ":memory:" else Path("/tmp/miso-ckpt"))
        self.checkpoint_root = Path(root)
        self.state = ClusterState()
        self.policy = self._make_policy()
        self._q: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._timers: list[tuple[float, int, str]] = []
        self._tseq = itertools.count()
        self._lock = threading.RLock()
        self._runs: dict[str, Run] = {}
        self._gpus: dict[str, GpuRef] = {}
        self._nodes: set[str] = set()
        self._node_fail: dict[str, int] = {}
        self._workers: dict[str, _GpuWorker] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._snapshot: dict[str, Any] = {"gpus": []}
        self._last_discover = 0.0
        self._busy = 0
        self.errors: list[str] = []

    # ---- construction -------------------------------------------------------------------

    def _make_policy(self) -> Any:
        kwargs: dict[str, Any] = {
            "estimator": make_estimator(self.cfg.estimator),
            "profile_seconds_per_level": self.cfg.profile_seconds_per_level,
            "reprofile_cooldown_s": self.cfg.reprofile_cooldown_s,
        }
        kwargs.update(self.cfg.policy_args)
        from miso.sched.policy import _REGISTRY, _load_builtin  # noqa: PLC0415

        _load_builtin()
        factory = _REGISTRY.get(self.cfg.policy)
        if factory is not None:
            try:
                params = inspect.signature(factory).parameters
                if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                    kwargs = {k: v for k, v in kwargs.items() if k in params}
            except (TypeError, ValueError):
                pass
        return make_policy(self.cfg.policy, **kwargs)

    def now(self) -> float:
        """Controller clock: seconds since the store was created (survives restarts)."""
        return time.time() - self.store.epoch

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> Controller:
        """Recover from the store, discover agents, start the threads."""
        self._recover()
        self._discover(force=True)
        for rec in self.store.jobs(active_only=True):
            self._post_event(JobSubmitted(JobSpec(rec.id, rec.name, rec.memory_gb,
                                                  rec.workload)))
        for name, fn in (("miso-loop", self._loop), ("miso-poll", self._poll_loop)):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, *, stop_jobs: bool = False) -> None:
        """Stop the threads; with ``stop_jobs`` also kill every job process (shutdown)."""
        self._stop.set()
        for w in list(self._workers.values()):
            w.close()
        for t in self._threads:
            t.join(timeout=10)
        if stop_jobs:
            for node in self.transport.nodes():
                with contextlib.suppress(NodeUnavailable):
                    self.transport.call(node, "shutdown", timeout=self.cfg.call_timeout)

    # ---- public API (thread-safe) -------------------------------------------------------

    def submit(self, command: list[str], *, name: str | None = None,
               memory_gb: float | None = None, workload: str | None = None,
               env: dict[str, str] | None = None, cwd: str | None = None) -> str:
        """Queue a job; returns its id. Raises :class:`SubmitError` on bad input."""
        command = [str(c) for c in command]
        if not command:
            raise SubmitError("no command given")
        if self.cfg.check_commands and shutil.which(command[0]) is None and \
                not Path(command[0]).exists():
            raise SubmitError(f"unknown command {command[0]!r}: not found on PATH")
        if workload is None and "miso.emuworkload" in command and "--workload" in command:
            i = command.index("--workload")
            workload = command[i + 1] if i + 1 < len(command) else None
        if workload is not None and workload not in catalogue():
            raise SubmitError(f"unknown workload {workload!r}")
        if memory_gb is None:
            memory_gb = catalogue()[workload].memory_gb if workload else 1.0
        if memory_gb <= 0:
            raise SubmitError(f"memory must be positive, got {memory_gb}")
        biggest = self._largest_slice()
        if memory_gb > biggest[0] + 1e-9:
            raise SubmitError(f"job needs {memory_gb:g} GB, more than the largest slice of "
                              f"any GPU ({biggest[0]:g} GiB, {biggest[1]})")
        try:
            rec = self.store.submit(command=command, name=name, memory_gb=memory_gb,
                                    workload=workload, env=env, cwd=cwd, at=self.now())
        except StoreError as e:
            raise SubmitError(str(e)) from None
        self._post_event(JobSubmitted(JobSpec(rec.id, rec.name, rec.memory_gb, rec.workload)))
        return rec.id

    def cancel(self, job: str) -> dict[str, Any]:
        """Cancel a job (kills its process); returns its record."""
        rec = self.store.get(job)
        if rec.terminal:
            raise SubmitError(f"job {rec.id} is already {rec.state}")
        done = threading.Event()
        self._q.put(("cancel", rec.id, done))
        done.wait(timeout=30)
        return self.store.get(rec.id).to_json()

    def status(self) -> dict[str, Any]:
        """GPUs (layout, phase, jobs) and jobs (state, slice, speed, progress)."""
        with self._lock:
            snap = dict(self._snapshot)
        snap["jobs"] = [r.to_json() for r in self.store.jobs()]
        snap["nodes"] = sorted(self._nodes)
        snap["time"] = self.now()
        snap["policy"] = getattr(self.policy, "name", self.cfg.policy)
        snap["errors"] = list(self.errors[-20:])
        return snap

    def logs(self, job: str, tail: int = 200) -> str:
        """Output of every attempt of ``job``, fetched from the nodes that ran it."""
        rec = self.store.get(job)
        out = []
        for node in sorted({a["node"] for a in self.store.attempts(rec.id)}):
            try:
                out.append(self.transport.call(node, "logs", rec.id, tail,
                                               timeout=self.cfg.call_timeout))
            except NodeUnavailable:
                out.append(f"--- {rec.id}: node {node} unreachable ---")
        if rec.reason:
            out.append(f"--- {rec.id} {rec.state}: {rec.reason}")
        return "\n".join(x for x in out if x)

    def idle(self) -> bool:
        """True when no job is active and nothing is being executed."""
        with self._lock:
            busy = self._busy or any(w.pending() for w in self._workers.values())
        return not busy and not self.store.jobs(active_only=True) and self._q.empty()

    def wait_all(self, timeout: float) -> bool:
        """Wait until every job is terminal; False on timeout."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.store.jobs(active_only=True):
                return True
            time.sleep(0.2)
        return False

    # ---- helpers ------------------------------------------------------------------------

    def _largest_slice(self) -> tuple[float, str]:
        with self._lock:
            geoms = [g.geom for g in self._gpus.values()]
        if not geoms:
            geoms = [geometry(m) for m in GPU_MODELS]
        best = max((max(p.memory_gib for p in g.profiles), g.model.name) for g in geoms)
        return best

    def _post_event(self, ev: Event) -> None:
        self._q.put(("event", ev))

    def _call(self, node: str, method: str, *args: Any) -> Any:
        return self.transport.call(node, method, *args, timeout=self.cfg.call_timeout)

    # ---- recovery -----------------------------------------------------------------------

    def _recover(self) -> None:
        active = {r.id: r for r in self.store.jobs(active_only=True)}
        now = self.now()
        for node in self.transport.nodes():
            try:
                rep = self._call(node, "report")
                for a in rep["jobs"]:
                    if a["status"] == "running":
                        if a["job"] in active:
                            self._call(node, "checkpoint", a["job"], a["attempt"])
                        else:
                            self._call(node, "kill", a["job"], a["attempt"])
                deadline = time.time() + self.cfg.checkpoint_timeout
                while time.time() < deadline:
                    rep = self._call(node, "report")
                    if all(a["status"] != "running" for a in rep["jobs"]):
                        break
                    time.sleep(self.cfg.poll_interval)
                for a in rep["jobs"]:
                    if a["status"] == "running":
                        self._call(node, "kill", a["job"], a["attempt"])
                rep = self._call(node, "report")
                for a in rep["jobs"]:
                    self._record_end(a, now)
                    if a["status"] == "finished" and a["job"] in active:
                        self.store.finish(a["job"], "finished", at=now)
                        self.store.log_event(now, "recovered-finish", {"job": a["job"]})
                    self._call(node, "forget", a["job"], a["attempt"])
                for g in self._call(node, "describe")["gpus"]:
                    if g["layout"]:
                        self._call(node, "apply_layout", g["index"], [])
            except NodeUnavailable as e:
                log.warning("recovery: %s", e)
        for r in self.store.jobs(active_only=True):
            self.store.update(r.id, state="queued", gpu=None, placement=None, mps_pct=None)
        if active:
            self.store.log_event(now, "recovered", {"active": sorted(active)})

    def _record_end(self, a: dict[str, Any], at: float) -> None:
        if a.get("checkpoint_iteration") is not None:
            self.store.progress(a["job"], checkpoint_iteration=a["checkpoint_iteration"],
                                checkpoint_path=a["checkpoint_path"])
        if a.get("iteration") is not None:
            self.store.progress(a["job"], iteration=a["iteration"], total=a.get("total"))
        self.store.end_attempt(a["job"], a["attempt"], status=a["status"], at=at,
                               end_iteration=a.get("iteration"),
                               checkpoint_iteration=a.get("checkpoint_iteration"),
                               start_iteration=a.get("start_iteration"), log=a.get("log"))

    # ---- discovery ----------------------------------------------------------------------

    def _discover(self, force: bool = False) -> None:
        if not force and time.time() - self._last_discover < self.cfg.discover_interval:
            return
        self._last_discover = time.time()
        try:
            nodes = self.transport.nodes()
        except Exception as e:  # noqa: BLE001 - a flaky listing must not kill the poller
            log.warning("listing nodes: %s", e)
            return
        for node in nodes:
            if node in self._nodes:
                continue
            try:
                desc = self._call(node, "describe")
                for g in desc["gpus"]:
                    if g["layout"]:
                        res = self._call(node, "apply_layout", g["index"], [])
                        if not res["ok"]:
                            log.warning("node %s GPU %s not cleared: %s", node, g["index"],
                                        res["error"])
            except NodeUnavailable as e:
                log.warning("new node %s: %s", node, e)
                continue
            with self._lock:
                self._nodes.add(node)
                self._node_fail[node] = 0
            for g in desc["gpus"]:
                if not g.get("mig", True):
                    log.warning("node %s GPU %d: MIG is off; not used", node, g["index"])
                    continue
                gid = f"{node}/{g['index']}"
                profiles = tuple(g["profiles"]) if g.get("profiles") else None
                geom = geometry(g["model"], profiles, g.get("driver"))
                with self._lock:
                    self._gpus[gid] = GpuRef(gid, node, g["index"], g["model"], geom)
                    self._workers[gid] = _GpuWorker(self, gid)
                self._post_event(GpuAdded(gid, g["model"], profiles, g.get("driver")))
            self.store.log_event(self.now(), "node-joined", {"node": node})

    # ---- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            timeout = 0.5
            if self._timers:
                timeout = max(0.0, min(timeout, self._timers[0][0] - self.now()))
            try:
                item = self._q.get(timeout=timeout)
            except queue.Empty:
                item = None
            while self._timers and self._timers[0][0] <= self.now():
                _, _, tag = heapq.heappop(self._timers)
                self._safe(self._handle, Tick(tag))
            if item is None:
                continue
            kind = item[0]
            if kind == "event":
                self._safe(self._handle, item[1])
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
            self.errors.append(f"{type(e).__name__}: {e}")

    def _handle(self, ev: Event) -> None:
        st = self.state
        now = self.now()
        match ev:
            case JobFinished(job=j) | JobFailed(job=j):
                js = st.jobs.get(j)
                if js is None or js.status in (JobStatus.FINISHED, JobStatus.FAILED):
                    return
                if isinstance(ev, JobFinished):
                    self.store.finish(j, "finished", at=now)
                else:
                    self.store.finish(j, "failed", reason=ev.reason, at=now)
            case SpeedObserved(job=j) | JobSpeedChanged(job=j):
                js = st.jobs.get(j)
                if js is None or js.status is not JobStatus.RUNNING or js.gpu != ev.gpu:
                    return
            case JobSubmitted(job=spec) if spec.id in st.jobs:
                return
            case _:
                pass
        st.observe(now, ev)
        self.store.log_event(now, type(ev).__name__, _ev_body(ev))
        decisions = self.policy.decide(now, ev, st)
        for d in decisions:
            try:
                st.apply(now, d)
            except ContractError as e:
                msg = f"policy {self.cfg.policy} broke the contract: {e}"
                log.error(msg)
                self.errors.append(msg)
                continue
            self.store.log_event(now, "decision:" + type(d).__name__, _ev_body(d))
            self._execute(d)

    def _execute(self, d: Decision) -> None:
        match d:
            case PlaceJob(job=j, gpu=g):
                self.store.update(j, gpu=g)
            case StartProfiling(gpu=g) | ApplyLayout(gpu=g) | RunMps(gpu=g):
                w = self._workers.get(g)
                if w is not None:
                    w.submit(d)
            case RequeueJob(job=j):
                with self._lock:
                    run = self._runs.get(j)
                g = run.gpu if run is not None else self.store.get(j).gpu
                w = self._workers.get(g) if g else None
                if w is not None:
                    w.submit(d)
                else:
                    self.store.update(j, state="queued", gpu=None, placement=None)
            case WakeUp(at=at, tag=tag):
                heapq.heappush(self._timers, (at, next(self._tseq), tag))

    def _cancel(self, job: str) -> None:
        now = self.now()
        if not self.store.finish(job, "cancelled", reason="cancelled by user", at=now):
            return
        with self._lock:
            run = self._runs.get(job)
            if run is not None:
                run.stopping = True
        if run is not None:
            with contextlib.suppress(NodeUnavailable):
                self._call(run.node, "kill", run.job, run.attempt)
        js = self.state.jobs.get(job)
        if js is not None and js.status not in (JobStatus.FINISHED, JobStatus.FAILED):
            self._handle(JobFailed(job, "cancelled"))

    def _node_lost(self, node: str) -> None:
        with self._lock:
            if node not in self._nodes:
                return
            self._nodes.discard(node)
            gpus = [g for g in self._gpus.values() if g.node == node]
            runs = [r for r in self._runs.values() if r.node == node]
            for r in runs:
                del self._runs[r.job]
        now = self.now()
        log.warning("node %s lost: %d GPUs, %d running jobs requeued", node, len(gpus),
                    len(runs))
        self.store.log_event(now, "node-lost", {"node": node, "jobs": [r.job for r in runs]})
        for r in runs:
            r.status = "lost"
            r.done.set()
            self.store.end_attempt(r.job, r.attempt, status="lost", at=now,
                                   end_iteration=r.last.get("iteration"),
                                   checkpoint_iteration=r.last.get("checkpoint_iteration"),
                                   start_iteration=r.last.get("start_iteration"))
        for g in gpus:
            with self._lock:
                w = self._workers.pop(g.id, None)
                self._gpus.pop(g.id, None)
            if w is not None:
                w.close()
            for j in list(self.state.gpus[g.id].jobs) if g.id in self.state.gpus else []:
                self.store.update(j, state="queued", gpu=None, placement=None, mps_pct=None)
            self._handle(GpuRemoved(g.id))

    def _update_snapshot(self) -> None:
        gpus = []
        for gid, gs in self.state.gpus.items():
            ref = self._gpus.get(gid)
            gpus.append({
                "id": gid, "node": ref.node if ref else "", "model": gs.model,
                "phase": str(gs.phase), "layout": [str(p) for p in gs.layout],
                "assignment": {j: str(p) for j, p in gs.assignment.items()},
                "mps_shares": dict(gs.mps_shares), "jobs": list(gs.jobs),
                "pending_plan": gs.pending_plan_id,
            })
        with self._lock:
            self._snapshot = {"gpus": gpus, "queue": list(self.state.queue)}

    # ---- polling ------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.time()
            try:
                self._discover()
                for node in sorted(self._nodes):
                    try:
                        rep = self._call(node, "report")
                    except NodeUnavailable as e:
                        n = self._node_fail.get(node, 0) + 1
                        self._node_fail[node] = n
                        log.warning("poll %s failed (%d): %s", node, n, e)
                        if n >= self.cfg.node_failures_to_lose or \
                                node not in self.transport.nodes():
                            self._q.put(("node_lost", node))
                        continue
                    self._node_fail[node] = 0
                    self._on_report(node, rep)
            except Exception as e:  # noqa: BLE001
                log.exception("poll failed")
                self.errors.append(f"poll: {e}")
            self._stop.wait(max(0.0, self.cfg.poll_interval - (time.time() - t0)))

    def _on_report(self, node: str, rep: dict[str, Any]) -> None:
        now = self.now()
        for a in rep["jobs"]:
            job, attempt = a["job"], a["attempt"]
            with self._lock:
                run = self._runs.get(job)
                current = run is not None and run.attempt == attempt and run.node == node
            if not current:
                if a["status"] == "running":
                    rec = self._safe_get(job)
                    if rec is None or rec.terminal or rec.attempts > attempt:
                        self._try(node, "kill", job, attempt)
                else:
                    self._try(node, "forget", job, attempt)
                continue
            assert run is not None
            run.last = a
            prog: dict[str, Any] = {}
            if a.get("iteration") is not None:
                prog.update(iteration=a["iteration"], total=a.get("total"), rate=a.get("rate"))
            if a.get("checkpoint_iteration") is not None:
                prog.update(checkpoint_iteration=a["checkpoint_iteration"],
                            checkpoint_path=a["checkpoint_path"])
            if prog:
                self.store.progress(job, **prog)
            if a["status"] == "running":
                if run.mps_pct is None and not run.stopping:
                    if a.get("steady_rate") and not run.observed_sent:
                        run.observed_sent = True
                        self._post_event(SpeedObserved(job, run.gpu, run.placement,
                                                       float(a["steady_rate"])))
                    if a.get("change_seq", 0) > run.change_seq_sent and a.get("change"):
                        run.change_seq_sent = a["change_seq"]
                        obs, base = a["change"]
                        self._post_event(JobSpeedChanged(job, run.gpu, float(obs),
                                                         float(base)))
                continue
            with self._lock:
                if self._runs.get(job) is run:
                    del self._runs[job]
            run.status = a["status"]
            self._record_end(a, now)
            if a["status"] == "finished":
                # Terminal in the store at once, not when the loop gets to the event: a GPU
                # worker between two MPS profiling levels must not relaunch a finished job.
                self.store.finish(job, "finished", at=now)
                self._post_event(JobFinished(job))
            elif not run.stopping:
                why = f"exit code {a['returncode']}" if a["status"] != "checkpointed" else \
                    "exited with the checkpoint code although no checkpoint was asked"
                tail = (a.get("log_tail") or "").strip()
                self._post_event(JobFailed(job, why + (f": {tail}" if tail else "")))
            run.done.set()
            self._try(node, "forget", job, attempt)

    def _safe_get(self, job: str) -> Any:
        try:
            return self.store.get(job)
        except StoreError:
            return None

    def _try(self, node: str, method: str, *args: Any) -> Any:
        try:
            return self._call(node, method, *args)
        except NodeUnavailable:
            return None

    # ---- plan execution (GPU worker threads) --------------------------------------------

    def _runs_on(self, gpu: str) -> list[Run]:
        with self._lock:
            return [r for r in self._runs.values() if r.gpu == gpu]

    def _stop_runs(self, runs: list[Run]) -> None:
        """Ask each run to checkpoint; after ``checkpoint_timeout`` kill what still runs."""
        if not runs:
            return
        for r in runs:
            r.stopping = True
            self.store.update(r.job, state="checkpointing")
            self._try(r.node, "checkpoint", r.job, r.attempt)
        deadline = time.time() + self.cfg.checkpoint_timeout
        for r in runs:
            r.done.wait(max(0.0, deadline - time.time()))
        late = [r for r in runs if not r.done.is_set()]
        for r in late:
            log.warning("job %s did not checkpoint within %.1fs: killing it", r.job,
                        self.cfg.checkpoint_timeout)
            self._try(r.node, "kill", r.job, r.attempt)
        for r in late:
            if not r.done.wait(10 + 5 * self.cfg.poll_interval):
                log.error("job %s attempt %d: no exit seen after kill", r.job, r.attempt)
                with self._lock:
                    if self._runs.get(r.job) is r:
                        del self._runs[r.job]
        for r in runs:
            self.store.update(r.job, state="queued")

    def _launch(self, job: str, gpu: str, pl: Placement, mps_pct: int | None, *,
                profiling: bool = False) -> Run | None:
        rec = self._safe_get(job)
        ref = self._gpus.get(gpu)
        if rec is None or rec.terminal or ref is None:
            return None
        with self._lock:
            if job in self._runs:
                return self._runs[job]
        now = self.now()
        resume = rec.checkpoint_iteration if rec.checkpoint_path else None
        attempt = self.store.new_attempt(job, node=ref.node, gpu=gpu, placement=str(pl),
                                         mps_pct=mps_pct, resume_iteration=resume, at=now,
                                         restart=rec.attempts > 0)
        spec = {"job": job, "attempt": attempt, "command": rec.command, "gpu": ref.index,
                "placement": [pl.start, pl.profile], "mps_pct": mps_pct,
                "checkpoint_dir": str(self.checkpoint_root / job),
                "resume_from": rec.checkpoint_path if resume is not None else None,
                "env": rec.env, "cwd": rec.cwd}
        run = Run(job, attempt, ref.node, gpu, ref.index, pl, mps_pct, time.time())
        with self._lock:
            self._runs[job] = run
        res = self._call(ref.node, "launch", spec)
        if not res["ok"]:
            with self._lock:
                self._runs.pop(job, None)
            self.store.end_attempt(job, attempt, status="failed", at=now, end_iteration=None,
                                   checkpoint_iteration=None, start_iteration=None,
                                   log=res.get("log"))
            self._post_event(JobFailed(job, res["error"]))
            return None
        fields: dict[str, Any] = {"state": "profiling" if profiling else "running", "gpu": gpu,
                                  "placement": str(pl), "mps_pct": mps_pct}
        if rec.started_at is None:
            fields["started_at"] = now
        self.store.update(job, **fields)
        return run

    def _apply(self, gpu: str, layout: list[Placement], plan_id: int | None) -> bool:
        ref = self._gpus[gpu]
        res = self._call(ref.node, "apply_layout", ref.index, layout_data(layout))
        self.store.record_layout(gpu, ref.model, res["layout"], plan_id=plan_id, ok=res["ok"],
                                 at=self.now())
        if not res["ok"]:
            self._fail_gpu(gpu, plan_id, res["error"])
        return bool(res["ok"])

    def _fail_gpu(self, gpu: str, plan_id: int | None, reason: str) -> None:
        """Leave the GPU empty (a known valid layout), its jobs stopped; ack LayoutFailed."""
        ref = self._gpus[gpu]
        self._stop_runs(self._runs_on(gpu))
        self._try(ref.node, "stop_mps", ref.index)
        for _ in range(3):
            res = self._call(ref.node, "apply_layout", ref.index, [])
            self.store.record_layout(gpu, ref.model, res["layout"], plan_id=plan_id,
                                     ok=res["ok"], at=self.now())
            if res["ok"]:
                break
        self.store.log_event(self.now(), "layout-failed", {"gpu": gpu, "plan_id": plan_id,
                                                           "reason": reason})
        if plan_id is not None:
            self._post_event(LayoutFailed(gpu, plan_id, reason))

    def _exec_apply(self, d: ApplyLayout) -> None:
        ref = self._gpus[d.gpu]
        runs = self._runs_on(d.gpu)
        cur_jobs = {r.job: r.placement for r in runs if r.mps_pct is None}
        cur_layout = [placement_of(x) for x in self._call(ref.node, "read_layout", ref.index)]
        try:
            plan = plan_transition(ref.geom, cur_layout, cur_jobs, d.layout, d.assignment)
            moving = set(plan.checkpoint)
            starts = list(plan.start)
        except TransitionError as e:  # e.g. a foreign instance: restart everything
            log.warning("GPU %s: %s; restarting all its jobs", d.gpu, e)
            moving = set(cur_jobs)
            starts = sorted(d.assignment.items())
        self._stop_runs([r for r in runs if r.job in moving or r.mps_pct is not None])
        if not self._apply(d.gpu, list(d.layout), d.plan_id):
            return
        if not any(r.mps_pct is not None for r in self._runs_on(d.gpu)):
            self._try(ref.node, "stop_mps", ref.index)
        for job, pl in starts:
            if job in d.assignment:
                self._launch(job, d.gpu, pl, None)
        self._post_event(LayoutApplied(d.gpu, d.plan_id))

    def _exec_mps(self, d: RunMps) -> None:
        ref = self._gpus[d.gpu]
        full = Placement(0, ref.geom.model.full_profile().name)
        runs = self._runs_on(d.gpu)
        self._stop_runs([r for r in runs if r.mps_pct is None or
                         r.mps_pct != d.shares.get(r.job)])
        if not self._apply(d.gpu, [full], d.plan_id):
            return
        for job, share in sorted(d.shares.items()):
            self._launch(job, d.gpu, full, int(share))
        self._post_event(LayoutApplied(d.gpu, d.plan_id))

    def _exec_profile(self, d: StartProfiling, worker: _GpuWorker) -> None:
        ref = self._gpus[d.gpu]
        full = Placement(0, ref.geom.model.full_profile().name)
        self._stop_runs(self._runs_on(d.gpu))
        if not self._apply(d.gpu, [full], d.plan_id):
            return
        levels = list(d.levels)
        order = [lv for lv in levels if lv != 100] + [100]
        rates: dict[str, dict[int, float]] = {j: {} for j in d.jobs}
        for i, lvl in enumerate(order):
            if worker.superseded(d):
                return
            runs = [r for r in (self._launch(j, d.gpu, full, lvl, profiling=True)
                                for j in d.jobs) if r is not None]
            self._await_progress(runs)
            if lvl in levels:
                for j, r in self._measure(runs, d.seconds_per_level, worker, d).items():
                    rates[j][lvl] = r
            if i < len(order) - 1:
                self._stop_runs([r for r in runs if not r.done.is_set()])
        speeds: dict[str, tuple[float, ...]] = {}
        for j in d.jobs:
            got = rates[j]
            if not got:
                continue  # finished, failed or never started during the run
            # a level that could not be measured takes the nearest measured level's rate; a
            # job that made no progress at a level gets a tiny positive rate (predictors need
            # positive rates)
            floor = 1e-3 * max(max(got.values()), 1e-3)
            speeds[j] = tuple(max(floor, got[lv] if lv in got else
                                  got[min(got, key=lambda x, lv=lv: abs(x - lv))])
                              for lv in levels)
        self.store.log_event(self.now(), "profile", {"gpu": d.gpu, "plan_id": d.plan_id,
                                                     "speeds": speeds})
        self._post_event(ProfilingFinished(d.gpu, d.plan_id, speeds, tuple(levels)))

    def _await_progress(self, runs: list[Run]) -> None:
        deadline = time.time() + 20.0
        while time.time() < deadline and not self._stop.is_set():
            if all(r.done.is_set() or (r.last.get("time") or 0) >= r.launched for r in runs):
                break
            time.sleep(self.cfg.poll_interval / 2)
        time.sleep(self.cfg.profile_warmup_s)

    def _measure(self, runs: list[Run], seconds: float, worker: _GpuWorker,
                 d: Decision) -> dict[str, float]:
        """Rate of each run over (at least) ``seconds``: first to last progress sample seen.

        The window is stretched (up to 4x) until every live run has two distinct samples, so a
        loaded node still yields a measurement for every job.
        """
        first: dict[str, tuple[float, float]] = {}
        last: dict[str, tuple[float, float]] = {}

        def sample() -> None:
            for r in runs:
                if r.done.is_set() or r.last.get("iteration") is None:
                    continue
                pt = (float(r.last["iteration"]), float(r.last["time"]))
                first.setdefault(r.job, pt)
                if pt[1] > first[r.job][1]:
                    last[r.job] = pt

        start = time.time()
        while not worker.superseded(d) and not self._stop.is_set():
            sample()
            waited = time.time() - start
            live = [r for r in runs if not r.done.is_set()]
            if waited >= seconds and (all(r.job in last for r in live) or
                                      waited >= 4 * seconds + 2.0):
                break
            time.sleep(min(0.05, self.cfg.poll_interval / 2))
        return {j: (last[j][0] - first[j][0]) / (last[j][1] - first[j][1]) for j in last}

    def _exec_requeue(self, d: RequeueJob, gpu: str) -> None:
        with self._lock:
            run = self._runs.get(d.job)
        if run is not None and run.gpu == gpu:
            self._stop_runs([run])
        self.store.update(d.job, state="queued", gpu=None, placement=None, mps_pct=None)

    def execute_on_gpu(self, gpu: str, d: Decision, worker: _GpuWorker) -> None:
        """Run one decision for ``gpu`` (called by its worker thread)."""
        with self._lock:
            self._busy += 1
        try:
            match d:
                case ApplyLayout():
                    self._exec_apply(d)
                case RunMps():
                    self._exec_mps(d)
                case StartProfiling():
                    self._exec_profile(d, worker)
                case RequeueJob():
                    self._exec_requeue(d, gpu)
        except NodeUnavailable as e:
            log.warning("GPU %s: node unreachable during %s: %s", gpu, type(d).__name__, e)
        except Exception as e:  # noqa: BLE001 - report, leave the GPU in a known state
            log.exception("GPU %s: executing %s failed", gpu, type(d).__name__)
            self.errors.append(f"{gpu}: {type(d).__name__}: {e}")
            pid = getattr(d, "plan_id", None)
            if pid is not None and gpu in self._gpus:
                try:
                    self._fail_gpu(gpu, pid, f"{type(e).__name__}: {e}")
                except Exception:  # noqa: BLE001
                    log.exception("GPU %s: could not clear after failure", gpu)
        finally:
            with self._lock:
                self._busy -= 1


class _GpuWorker:
    """Executes one GPU's decisions in order; a queued plan is skipped when a newer plan for
    the same GPU is queued behind it (the core ignores acks of superseded plans)."""

    def __init__(self, ctl: Controller, gpu: str) -> None:
        self.ctl = ctl
        self.gpu = gpu
        self._ops: deque[Decision] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._latest_plan = 0
        self._current: Decision | None = None
        self._t = threading.Thread(target=self._run, name=f"miso-gpu-{gpu}", daemon=True)
        self._t.start()

    def submit(self, d: Decision) -> None:
        with self._cond:
            pid = getattr(d, "plan_id", None)
            if pid is not None:
                self._latest_plan = max(self._latest_plan, pid)
            self._ops.append(d)
            self._cond.notify()

    def superseded(self, d: Decision) -> bool:
        pid = getattr(d, "plan_id", None)
        return pid is not None and pid < self._latest_plan

    def pending(self) -> bool:
        with self._cond:
            return bool(self._ops) or self._current is not None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._ops.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._ops and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                d = self._ops.popleft()
                if self.superseded(d) and not isinstance(d, RequeueJob):
                    continue
                self._current = d
            try:
                self.ctl.execute_on_gpu(self.gpu, d, self)
            finally:
                with self._cond:
                    self._current = None
