"""Figures of merit of a simulation run (the paper's, plus a few more).

* JCT = finish - submit (queueing + run), average / median / p95.
* makespan = last finish - first submission.
* STP = time average of the sum of job speeds (relative to each job alone on a full GPU) per
  busy GPU = total work done (GPU-seconds of full-GPU work, i.e. the sum of job durations) /
  total busy GPU time (a GPU is busy while at least one job is resident on it).
* relative JCT = JCT / the job's run time alone on a full GPU (>= 1 up to profiling speed-ups).
* restarts per job (every restart of a job that had made progress: moves, requeues, MPS
  profiling and each MPS level switch); ``lost_gpu_s`` (GPU time thrown away by restarts: waits
  times the GPU share held, plus discarded progress of jobs that cannot checkpoint);
  ``profiling_gpu_s`` (GPU time of MPS profiling runs); GPU utilisation = busy GPU
  time / (GPUs x makespan).
"""

from __future__ import annotations

import numpy as np

from miso.sim.engine import SimResult


def summarize(r: SimResult) -> dict[str, float]:
    """The JSON-ready figures of one run."""
    jct = r.jct
    makespan = float(r.finish.max() - r.submit.min())
    rel = jct / r.duration
    return {
        "jobs": int(len(jct)),
        "avg_jct_s": float(jct.mean()),
        "median_jct_s": float(np.median(jct)),
        "p95_jct_s": float(np.percentile(jct, 95)),
        "makespan_s": makespan,
        "stp": float(r.duration.sum() / r.busy_gpu_s) if r.busy_gpu_s > 0 else 0.0,
        "avg_relative_jct": float(rel.mean()),
        "median_relative_jct": float(np.median(rel)),
        "restarts": int(r.restarts.sum()),
        "restarts_per_job": float(r.restarts.mean()),
        "lost_gpu_s": float(r.lost_gpu_s),
        "profiling_gpu_s": float(r.profiling_gpu_s),
        "gpu_utilisation": float(r.busy_gpu_s / (r.n_gpus * makespan)) if makespan > 0 else 0.0,
        "events": r.events,
        "decisions": r.decisions,
        "wall_s": r.wall_s,
    }


def relative_jct(r: SimResult) -> np.ndarray:
    """Per-job JCT / run time alone on a full GPU."""
    return r.jct / r.duration
