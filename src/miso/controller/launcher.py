"""Starting and stopping one job's run on a GPU: the two steps every plan is made of.

:class:`Launcher` stops runs (ask for a checkpoint, wait ``checkpoint_timeout``, then kill)
and launches a job on an instance from its newest checkpoint (:func:`resume_point`). The
executor (:mod:`~miso.controller.executor`) and the profiling run
(:mod:`~miso.controller.profile_run`) are built from these two steps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miso import jobpaths
from miso.attemptstatus import AttemptStatus
from miso.controller.runtime import Run, Runtime
from miso.job import last_checkpoint
from miso.jobstatus import JobStatus
from miso.mig import Placement
from miso.sched import JobFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Relaunch:
    """Restart a job in its current slot (its process was fenced while the slot stayed its)."""

    job: str
    gpu: str
    placement: Placement
    mps_pct: int | None


def resume_point(rec_iteration: int | None, rec_path: str | None,
                 checkpoint_dir: Path, total: int | None = None
                 ) -> tuple[int | None, str | None]:
    """The newest checkpoint of a job: the store's, or the helper's own record of its last
    save in ``checkpoint_dir`` when that is newer or the store has none (the store may have
    missed the last save, or have been lost). The job wrote that record: it counts only when
    its path lies inside ``checkpoint_dir`` and is reached there without following a link
    (no existence oracle on root's paths), and its iteration is at most the job's ``total``."""
    disk = last_checkpoint(checkpoint_dir)
    if disk is not None and (total is not None and isinstance(disk.get("iteration"), int)
                             and disk["iteration"] > total):
        disk = None
    if disk is not None and jobpaths.exists_inside(checkpoint_dir, disk["path"]):
        it = disk.get("iteration")
        if rec_path is None or (isinstance(it, int) and it > (rec_iteration or -1)):
            return (it if isinstance(it, int) else None), str(disk["path"])
    if rec_path is None and jobpaths.exists_inside(checkpoint_dir,
                                                   checkpoint_dir / "checkpoint.json"):
        return None, str(checkpoint_dir / "checkpoint.json")
    if rec_path is not None and not jobpaths.inside(checkpoint_dir, rec_path):
        return None, None  # a report named a path outside the job's dir: never handed on
    return rec_iteration, rec_path


def stale_checkpoint(rec_iteration: int | None, rec_path: str | None,
                     resume: int | None, path: str | None) -> bool:
    """Whether the store's checkpoint (``rec_*``) is behind the resume point found: another
    file, or the same file saved again at a later iteration (a helper reuses its path), so
    ``status`` shows the iteration the job resumes from."""
    return path is not None and (path != rec_path or resume != rec_iteration)


class Launcher:
    """Stops and launches runs through the agents (see the module docstring)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def stop(self, runs: list[Run]) -> None:
        """Ask each run to checkpoint; after ``checkpoint_timeout`` kill what still runs."""
        rt = self.rt
        if not runs:
            return
        t0 = time.monotonic()
        for r in runs:
            r.stopping = True
            rt.store.update(r.job, state=JobStatus.CHECKPOINTING)
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
            rt.store.update(r.job, state=JobStatus.QUEUED)
        if rt.observer is not None:
            rt.observer.on_timing("checkpoint", time.monotonic() - t0)

    def launch(self, job: str, gpu: str, pl: Placement, mps_pct: int | None, *,
               profiling: bool = False) -> Run | None:
        """Start ``job`` on instance ``pl`` of ``gpu`` (under MPS at ``mps_pct`` % when
        given); None when it is not started (gone, finished, or its old run would not stop)."""
        rt = self.rt
        rec = rt.job(job)
        ref = rt.gpus.get(gpu)
        if rec is None or rec.terminal or ref is None:
            return None
        # A job moved by one batch (requeued from one GPU, placed on another) still runs on
        # its old GPU until that GPU's worker has checkpointed it: wait for that, never run
        # two copies, and never mistake the old run for the new one.
        deadline = time.monotonic() + rt.cfg.checkpoint_timeout + rt.cfg.call_timeout
        waited = False
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
            waited = True
        if waited:  # read again: the old copy may have finished the job, or saved
            rec = rt.job(job) or rec
            if rec.terminal:  # never run a finished job again
                return None
        now = rt.now()
        ck_dir = rt.checkpoint_root / job
        resume, path = resume_point(rec.checkpoint_iteration, rec.checkpoint_path, ck_dir,
                                    rec.total)
        if stale_checkpoint(rec.checkpoint_iteration, rec.checkpoint_path, resume, path):
            rt.store.progress(job, checkpoint_iteration=resume, checkpoint_path=path)
        attempt = rt.store.new_attempt(job, node=ref.node, gpu=gpu, placement=str(pl),
                                       mps_pct=mps_pct, resume_iteration=resume, at=now,
                                       restart=rec.attempts > 0,
                                       at_least=rt.used_attempts(job) + 1)
        spec = {"job": job, "attempt": attempt, "command": rec.command, "gpu": ref.index,
                "placement": [pl.start, pl.profile], "mps_pct": mps_pct,
                "checkpoint_dir": str(ck_dir), "resume_from": path,
                "env": rec.env, "cwd": rec.cwd, "owner": rec.owner, "unix_user": rec.unix_user,
                "host_memory_gb": rec.host_memory_gb}
        # wall time: compared with the agent's report timestamps (another process)
        run = Run(job, attempt, ref.node, gpu, ref.index, pl, mps_pct, time.time())
        with rt.lock:
            rt.runs[job] = run
        res = rt.call(ref.node, "launch", spec)
        if not res["ok"]:
            rt.drop_run(run)
            rt.store.end_attempt(job, attempt, status=AttemptStatus.FAILED, at=now,
                                 end_iteration=None, checkpoint_iteration=None,
                                 start_iteration=None, log=res.get("log"))
            rt.post_event(JobFailed(job, res["error"]))
            return None
        fields: dict[str, Any] = {
            "state": JobStatus.PROFILING if profiling else JobStatus.RUNNING, "gpu": gpu,
            "placement": str(pl), "mps_pct": mps_pct}
        if rec.started_at is None:
            fields["started_at"] = now
        rt.store.update(job, **fields)
        return run
