"""Plan execution: one worker thread per GPU carries out that GPU's decisions in order.

For each decision the executor checkpoints the jobs that move (ask, wait
``checkpoint_timeout``, then kill), reconfigures through the agent, restarts the jobs on their
new instances and acknowledges with ``LayoutApplied`` / ``LayoutFailed`` /
``ProfilingFinished``. Jobs whose instance is kept keep running
(:func:`miso.mig.plan_transition`). A newer plan for a GPU supersedes a queued older one. A
failed reconfiguration leaves the GPU empty (a known valid layout) with its jobs checkpointed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miso.agent.agent import layout_data, placement_of
from miso.controller.runtime import GpuRef, Run, Runtime
from miso.job import last_checkpoint
from miso.mig import Placement, TransitionError, plan_transition
from miso.sched import (
    ApplyLayout,
    Decision,
    JobFailed,
    LayoutApplied,
    LayoutFailed,
    ProfilingFinished,
    RequeueJob,
    RunMps,
    StartProfiling,
)
from miso.sched.events import profiling_run_order
from miso.sched.profiles import fill_missing_levels
from miso.transport.base import NodeUnavailable

log = logging.getLogger(__name__)

NOT_PROFILED = "not profiled: no progress reports"


@dataclass(frozen=True)
class Relaunch:
    """Restart a job in its current slot (its process was fenced while the slot stayed its)."""

    job: str
    gpu: str
    placement: Placement
    mps_pct: int | None


def resume_point(rec_iteration: int | None, rec_path: str | None,
                 checkpoint_dir: Path) -> tuple[int | None, str | None]:
    """The newest checkpoint of a job: the store's, or the helper's own record of its last
    save in ``checkpoint_dir`` when that is newer or the store has none (the store may have
    missed the last save, or have been lost)."""
    disk = last_checkpoint(checkpoint_dir)
    if disk is not None and Path(disk["path"]).exists():
        it = disk.get("iteration")
        if rec_path is None or (isinstance(it, int) and it > (rec_iteration or -1)):
            return (it if isinstance(it, int) else None), str(disk["path"])
    if rec_path is None and (checkpoint_dir / "checkpoint.json").exists():
        return None, str(checkpoint_dir / "checkpoint.json")
    return rec_iteration, rec_path


class PlanExecutor:
    """Executes decisions on GPUs through their agents (see the module docstring)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._workers: dict[str, GpuWorker] = {}
        self._busy = 0

    # ---- workers ------------------------------------------------------------------------

    def add_gpu(self, ref: GpuRef) -> None:
        with self.rt.lock:
            self.rt.gpus[ref.id] = ref
            self._workers[ref.id] = GpuWorker(self, ref.id)

    def close_gpu(self, gpu: str) -> None:
        """Stop executing on ``gpu`` (its node is being fenced); the GPU stays known."""
        with self.rt.lock:
            w = self._workers.pop(gpu, None)
        if w is not None:
            w.close()

    def remove_gpu(self, gpu: str) -> None:
        with self.rt.lock:
            w = self._workers.pop(gpu, None)
            self.rt.gpus.pop(gpu, None)
        if w is not None:
            w.close()

    def submit(self, gpu: str, d: Decision) -> bool:
        """Queue ``d`` on ``gpu``'s worker; False when the GPU is unknown."""
        with self.rt.lock:
            w = self._workers.get(gpu)
        if w is None:
            return False
        w.submit(d)
        return True

    def busy(self) -> bool:
        with self.rt.lock:
            return bool(self._busy) or any(w.pending() for w in self._workers.values())

    def close(self) -> None:
        with self.rt.lock:
            workers = list(self._workers.values())
        for w in workers:
            w.close()

    # ---- one decision -------------------------------------------------------------------

    def execute_on_gpu(self, gpu: str, d: Decision, worker: GpuWorker) -> None:
        """Run one decision for ``gpu`` (called by its worker thread)."""
        with self.rt.lock:
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
                case Relaunch():
                    self._launch(d.job, d.gpu, d.placement, d.mps_pct)
        except NodeUnavailable as e:
            log.warning("GPU %s: node unreachable during %s: %s", gpu, type(d).__name__, e)
        except Exception as e:  # noqa: BLE001 - report, leave the GPU in a known state
            log.exception("GPU %s: executing %s failed", gpu, type(d).__name__)
            self.rt.error(f"{gpu}: {type(d).__name__}: {e}")
            pid = getattr(d, "plan_id", None)
            if pid is not None and gpu in self.rt.gpus:
                try:
                    self._fail_gpu(gpu, pid, f"{type(e).__name__}: {e}")
                except Exception:  # noqa: BLE001
                    log.exception("GPU %s: could not clear after failure", gpu)
        finally:
            with self.rt.lock:
                self._busy -= 1

    def _stop_runs(self, runs: list[Run]) -> None:
        """Ask each run to checkpoint; after ``checkpoint_timeout`` kill what still runs."""
        rt = self.rt
        if not runs:
            return
        t0 = time.monotonic()
        for r in runs:
            r.stopping = True
            rt.store.update(r.job, state="checkpointing")
            rt.try_call(r.node, "checkpoint", r.job, r.attempt)
        deadline = time.monotonic() + rt.cfg.checkpoint_timeout
        for r in runs:
            r.done.wait(max(0.0, deadline - time.monotonic()))
        late = [r for r in runs if not r.done.is_set()]
        for r in late:
            log.warning("job %s did not checkpoint within %.1fs: killing it", r.job,
                        rt.cfg.checkpoint_timeout)
            rt.try_call(r.node, "kill", r.job, r.attempt)
        for r in late:
            if not r.done.wait(10 + 5 * rt.cfg.poll_interval):
                log.error("job %s attempt %d: no exit seen after kill", r.job, r.attempt)
                rt.drop_run(r)
        for r in runs:
            rt.store.update(r.job, state="queued")
        if rt.observer is not None:
            rt.observer.on_timing("checkpoint", time.monotonic() - t0)

    def _launch(self, job: str, gpu: str, pl: Placement, mps_pct: int | None, *,
                profiling: bool = False) -> Run | None:
        rt = self.rt
        rec = rt.job(job)
        ref = rt.gpus.get(gpu)
        if rec is None or rec.terminal or ref is None:
            return None
        # A job moved by one batch (requeued from one GPU, placed on another) still runs on
        # its old GPU until that GPU's worker has checkpointed it: wait for that, never run
        # two copies, and never mistake the old run for the new one.
        deadline = time.monotonic() + rt.cfg.checkpoint_timeout + rt.cfg.call_timeout
        while True:
            with rt.lock:
                cur = rt.runs.get(job)
            if cur is None:
                break
            if cur.gpu == gpu:
                return cur
            if time.monotonic() > deadline:
                log.warning("job %s: still running on %s; not started on %s", job, cur.gpu, gpu)
                return None
            time.sleep(0.05)
        rec = rt.job(job) or rec
        if rec.terminal:  # the old copy finished the job while we waited: never run it again
            return None
        now = rt.now()
        ck_dir = rt.checkpoint_root / job
        resume, path = resume_point(rec.checkpoint_iteration, rec.checkpoint_path, ck_dir)
        if path is not None and path != rec.checkpoint_path:
            rt.store.progress(job, checkpoint_iteration=resume, checkpoint_path=path)
        attempt = rt.store.new_attempt(job, node=ref.node, gpu=gpu, placement=str(pl),
                                       mps_pct=mps_pct, resume_iteration=resume, at=now,
                                       restart=rec.attempts > 0,
                                       at_least=rt.used_attempts(job) + 1)
        spec = {"job": job, "attempt": attempt, "command": rec.command, "gpu": ref.index,
                "placement": [pl.start, pl.profile], "mps_pct": mps_pct,
                "checkpoint_dir": str(ck_dir), "resume_from": path,
                "env": rec.env, "cwd": rec.cwd, "owner": rec.owner, "unix_user": rec.unix_user}
        # wall time: compared with the agent's report timestamps (another process)
        run = Run(job, attempt, ref.node, gpu, ref.index, pl, mps_pct, time.time())
        with rt.lock:
            rt.runs[job] = run
        res = rt.call(ref.node, "launch", spec)
        if not res["ok"]:
            rt.drop_run(run)
            rt.store.end_attempt(job, attempt, status="failed", at=now, end_iteration=None,
                                 checkpoint_iteration=None, start_iteration=None,
                                 log=res.get("log"))
            rt.post_event(JobFailed(job, res["error"]))
            return None
        fields: dict[str, Any] = {"state": "profiling" if profiling else "running", "gpu": gpu,
                                  "placement": str(pl), "mps_pct": mps_pct}
        if rec.started_at is None:
            fields["started_at"] = now
        rt.store.update(job, **fields)
        return run

    def _apply(self, gpu: str, layout: list[Placement], plan_id: int | None) -> bool:
        rt = self.rt
        ref = rt.gpus[gpu]
        res = rt.call(ref.node, "apply_layout", ref.index, layout_data(layout))
        rt.store.record_layout(gpu, ref.model, res["layout"], plan_id=plan_id, ok=res["ok"],
                               at=rt.now())
        if not res["ok"]:
            self._fail_gpu(gpu, plan_id, res["error"])
        return bool(res["ok"])

    def _fail_gpu(self, gpu: str, plan_id: int | None, reason: str) -> None:
        """Leave the GPU empty (a known valid layout), its jobs stopped; ack LayoutFailed."""
        rt = self.rt
        ref = rt.gpus[gpu]
        self._stop_runs(rt.runs_on(gpu))
        rt.try_call(ref.node, "stop_mps", ref.index)
        for _ in range(3):
            res = rt.call(ref.node, "apply_layout", ref.index, [])
            rt.store.record_layout(gpu, ref.model, res["layout"], plan_id=plan_id,
                                   ok=res["ok"], at=rt.now())
            if res["ok"]:
                break
        rt.store.log_event(rt.now(), "layout-failed", {"gpu": gpu, "plan_id": plan_id,
                                                       "reason": reason})
        if plan_id is not None:
            rt.post_event(LayoutFailed(gpu, plan_id, reason))

    def _exec_apply(self, d: ApplyLayout) -> None:
        rt = self.rt
        ref = rt.gpus[d.gpu]
        runs = rt.runs_on(d.gpu)
        cur_jobs = {r.job: r.placement for r in runs if r.mps_pct is None}
        cur_layout = [placement_of(x) for x in rt.call(ref.node, "read_layout", ref.index)]
        try:
            plan = plan_transition(ref.geom, cur_layout, cur_jobs, d.layout, d.assignment)
            moving = set(plan.checkpoint)
            starts = list(plan.start)
        except TransitionError as e:  # e.g. a foreign instance: restart everything
            log.warning("GPU %s: %s; restarting all its jobs", d.gpu, e)
            moving = set(cur_jobs)
            starts = sorted(d.assignment.items())
        keep = self._kept_profiled_run(d, runs, Placement(0, ref.geom.model.full_profile().name))
        self._stop_runs([r for r in runs
                         if (r.job in moving or r.mps_pct is not None) and r is not keep])
        if not self._apply(d.gpu, list(d.layout), d.plan_id):
            return
        if not any(r.mps_pct is not None for r in rt.runs_on(d.gpu)):
            rt.try_call(ref.node, "stop_mps", ref.index)
        for job, pl in starts:
            if job in d.assignment:
                self._launch(job, d.gpu, pl, None)
        if keep is not None:
            rt.store.update(keep.job, state="running")
        rt.post_event(LayoutApplied(d.gpu, d.plan_id))

    @staticmethod
    def _kept_profiled_run(d: ApplyLayout, runs: list[Run], full: Placement) -> Run | None:
        """The run that keeps going through ``d``: a job profiled alone, still running under
        MPS at 100 % of the whole GPU, that ``d`` gives the whole GPU. Stopping it would be a
        restart that buys nothing (the simulator does not stop it either,
        :mod:`miso.sim.engine`); it stays an MPS run, so the next plan that moves it stops it."""
        if len(d.assignment) != 1 or len(runs) != 1:
            return None
        (job, pl), = d.assignment.items()
        r = runs[0]
        if r.job != job or r.mps_pct != 100 or r.placement != full or pl != full \
                or tuple(d.layout) != (full,) or r.stopping or r.done.is_set():
            return None
        return r

    def _exec_mps(self, d: RunMps) -> None:
        rt = self.rt
        ref = rt.gpus[d.gpu]
        full = Placement(0, ref.geom.model.full_profile().name)
        runs = rt.runs_on(d.gpu)
        self._stop_runs([r for r in runs if r.mps_pct is None or
                         r.mps_pct != d.shares.get(r.job)])
        if not self._apply(d.gpu, [full], d.plan_id):
            return
        for job, share in sorted(d.shares.items()):
            self._launch(job, d.gpu, full, int(share))
        rt.post_event(LayoutApplied(d.gpu, d.plan_id))

    def _exec_profile(self, d: StartProfiling, worker: GpuWorker) -> None:
        rt = self.rt
        ref = rt.gpus[d.gpu]
        full = Placement(0, ref.geom.model.full_profile().name)
        self._stop_runs(rt.runs_on(d.gpu))
        if not self._apply(d.gpu, [full], d.plan_id):
            return
        levels = list(d.levels)
        order = profiling_run_order(d.levels)
        rates: dict[str, dict[int, float]] = {j: {} for j in d.jobs}
        for i, lvl in enumerate(order):
            if worker.superseded(d):
                return
            runs = [r for r in (self._launch(j, d.gpu, full, lvl, profiling=True)
                                for j in d.jobs) if r is not None]
            self._await_progress(runs)
            silent = [r for r in runs if r.last.get("checkpointable") is False]
            for r in silent:
                rt.store.progress(r.job, note=NOT_PROFILED)
            if lvl in levels:
                measured = [r for r in runs if r.job not in {x.job for x in silent}]
                for j, r in self._measure(measured, d.seconds_per_level, worker, d).items():
                    rates[j][lvl] = r
            if i < len(order) - 1:
                self._stop_runs([r for r in runs if not r.done.is_set()])
        speeds: dict[str, tuple[float, ...]] = {}
        for j in d.jobs:
            got = rates[j]
            if not got:
                continue  # finished, failed or never started during the run
            # a level without a usable reading: the one rule of miso.sched.profiles
            speeds[j] = fill_missing_levels([got.get(lv) for lv in levels])
        rt.store.log_event(rt.now(), "profile", {"gpu": d.gpu, "plan_id": d.plan_id,
                                                 "speeds": speeds})
        rt.post_event(ProfilingFinished(d.gpu, d.plan_id, speeds, tuple(levels)))

    def _await_progress(self, runs: list[Run]) -> None:
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and not self.rt.stopping.is_set():
            # a job the agent found silent (no progress within its grace) is not waited for
            if all(r.done.is_set() or (r.last.get("time") or 0) >= r.launched or
                   r.last.get("checkpointable") is False for r in runs):
                break
            time.sleep(self.rt.cfg.poll_interval / 2)
        time.sleep(self.rt.cfg.profile_warmup_s)

    def _measure(self, runs: list[Run], seconds: float, worker: GpuWorker,
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

        start = time.monotonic()
        while not worker.superseded(d) and not self.rt.stopping.is_set():
            sample()
            waited = time.monotonic() - start
            live = [r for r in runs if not r.done.is_set()]
            if waited >= seconds and (all(r.job in last for r in live) or
                                      waited >= 4 * seconds + 2.0):
                break
            time.sleep(min(0.05, self.rt.cfg.poll_interval / 2))
        return {j: (last[j][0] - first[j][0]) / (last[j][1] - first[j][1]) for j in last}

    def _exec_requeue(self, d: RequeueJob, gpu: str) -> None:
        with self.rt.lock:
            run = self.rt.runs.get(d.job)
        if run is not None and run.gpu == gpu:
            self._stop_runs([run])
        rec = self.rt.job(d.job)
        if rec is not None and rec.gpu not in (None, gpu):
            return  # placed on another GPU in the same batch: that GPU's plan starts it
        self.rt.store.update(d.job, state="queued", gpu=None, placement=None, mps_pct=None)


class GpuWorker:
    """Executes one GPU's decisions in order; a queued plan is skipped when a newer plan for
    the same GPU is queued behind it (the core ignores acks of superseded plans)."""

    def __init__(self, executor: PlanExecutor, gpu: str) -> None:
        self.executor = executor
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
                self.executor.execute_on_gpu(self.gpu, d, self)
            finally:
                with self._cond:
                    self._current = None
