"""Plan execution: one worker thread per GPU (:mod:`~miso.controller.gpu_worker`) carries out
that GPU's decisions in order.

For each decision the executor checkpoints the jobs that move (ask, wait
``checkpoint_timeout``, then kill), reconfigures through the agent, restarts the jobs on their
new instances (both steps: :mod:`~miso.controller.launcher`) and acknowledges with
``LayoutApplied`` / ``LayoutFailed`` / ``ProfilingFinished`` (the measuring:
:mod:`~miso.controller.profile_run`). Jobs whose instance is kept keep running
(:func:`miso.mig.plan_transition`). A newer plan for a GPU supersedes a queued older one. A
failed reconfiguration leaves the GPU empty (a known valid layout) with its jobs checkpointed.
"""

from __future__ import annotations

import logging

from miso.controller.gangs import GangRunner
from miso.controller.gpu_worker import GpuWorker
from miso.controller.launcher import Launcher, Relaunch
from miso.controller.profile_run import ProfileRun
from miso.controller.runtime import GpuRef, Run, Runtime
from miso.jobstatus import JobStatus
from miso.mig import Placement, TransitionError, plan_transition
from miso.nodeerrors import NodeUnavailable
from miso.nodewire import layout_data, placement_of
from miso.sched import (
    ApplyLayout,
    Decision,
    LayoutApplied,
    LayoutFailed,
    ProfilingFinished,
    RequeueJob,
    RunMps,
    StartProfiling,
)

log = logging.getLogger(__name__)



class PlanExecutor:
    """Executes decisions on GPUs through their agents (see the module docstring)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._workers: dict[str, GpuWorker] = {}
        self._busy = 0
        self.launcher = Launcher(rt)
        self.profiler = ProfileRun(rt, self.launcher)
        #: gangs' starts and stops (:mod:`miso.controller.gangs`)
        self.gangs = GangRunner(rt, self.launcher)

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
            return bool(self._busy) or any(w.pending() for w in self._workers.values()) \
                or self.gangs.busy()

    def close(self) -> None:
        with self.rt.lock:
            workers = list(self._workers.values())
        for w in workers:
            w.close()
        self.gangs.close()

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
                    self.launcher.launch(d.job, d.gpu, d.placement, d.mps_pct)
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
        self.launcher.stop(rt.runs_on(gpu))
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
        self.launcher.stop([r for r in runs
                            if (r.job in moving or r.mps_pct is not None) and r is not keep])
        if not self._apply(d.gpu, list(d.layout), d.plan_id):
            return
        if not any(r.mps_pct is not None for r in rt.runs_on(d.gpu)):
            rt.try_call(ref.node, "stop_mps", ref.index)
        for job, pl in starts:
            if job in d.assignment:
                self.launcher.launch(job, d.gpu, pl, None)
        if keep is not None:
            rt.store.update(keep.job, state=JobStatus.RUNNING)
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
        self.launcher.stop([r for r in runs if r.mps_pct is None or
                            r.mps_pct != d.shares.get(r.job)])
        if not self._apply(d.gpu, [full], d.plan_id):
            return
        for job, share in sorted(d.shares.items()):
            self.launcher.launch(job, d.gpu, full, int(share))
        rt.post_event(LayoutApplied(d.gpu, d.plan_id))

    def _exec_profile(self, d: StartProfiling, worker: GpuWorker) -> None:
        rt = self.rt
        ref = rt.gpus[d.gpu]
        full = Placement(0, ref.geom.model.full_profile().name)
        self.launcher.stop(rt.runs_on(d.gpu))
        if not self._apply(d.gpu, [full], d.plan_id):
            return
        speeds = self.profiler.measure(d, full, worker)
        if speeds is None:
            return  # superseded by a newer plan for this GPU
        rt.store.log_event(rt.now(), "profile", {"gpu": d.gpu, "plan_id": d.plan_id,
                                                 "speeds": speeds})
        rt.post_event(ProfilingFinished(d.gpu, d.plan_id, speeds, tuple(d.levels)))

    def _exec_requeue(self, d: RequeueJob, gpu: str) -> None:
        with self.rt.lock:
            run = self.rt.runs.get(d.job)
        if run is not None and run.gpu == gpu:
            self.launcher.stop([run])
        rec = self.rt.job(d.job)
        if rec is not None and rec.gpu not in (None, gpu):
            return  # placed on another GPU in the same batch: that GPU's plan starts it
        self.rt.store.update(d.job, state=JobStatus.QUEUED, gpu=None, placement=None, mps_pct=None)
