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
        "stp": float(_gpu_work(r) / r.busy_gpu_s) if r.busy_gpu_s > 0 else 0.0,
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
    } | tenant_figures(r) | gang_figures(r)


def gang_figures(r: SimResult) -> dict[str, float]:
    """With jobs on several GPUs (gangs): their count, their queueing delay (submit to first
    start: average, p95), their average JCT, and ``gang_wait_idle_gpu_h``, the GPU-hours of
    GPUs holding no job while some gang waited (fragmentation)."""
    if r.num_gpus is None or not (r.num_gpus > 1).any() or r.first_start is None:
        return {}
    m = r.num_gpus > 1
    delay = (r.first_start - r.submit)[m]
    return {"gang_jobs": int(m.sum()),
            "gang_avg_queue_s": float(delay.mean()),
            "gang_p95_queue_s": float(np.percentile(delay, 95)),
            "gang_avg_jct_s": float(r.jct[m].mean()),
            "small_avg_jct_s": float(r.jct[~m].mean()) if (~m).any() else 0.0,
            "gang_wait_idle_gpu_h": r.gang_idle_gpu_s / 3600.0,
            "gpu_hours": float((r.duration * r.num_gpus).sum() / 3600.0)}


def _gpu_work(r: SimResult) -> float:
    """Full-GPU seconds of work: each job's run time times the GPUs it runs on."""
    if r.num_gpus is None:
        return float(r.duration.sum())
    return float((r.duration * r.num_gpus).sum())


def jain(xs: list[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n sum x^2)``: 1 when all equal, 1/n at worst."""
    if not xs:
        return 1.0
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


def tenant_figures(r: SimResult) -> dict[str, object]:
    """Per-owner figures when the run had owners (tenancy on): ``owners`` {owner: avg_jct_s,
    mean_slowdown (JCT / run time alone on a full GPU), gpu_share (share of the GPU-equivalent
    time held), jobs}, ``jain_slowdown`` (Jain's index over the owners' mean slowdowns); with
    priorities, ``priorities`` {class: jobs, avg_jct_s, avg_queue_delay_s (submit to first
    start)} and the preemptions with the GPU time their restarts threw away; ``reclaims``
    (jobs fair share requeued to return a GPU) and ``reclaim_lost_gpu_s``."""
    if not r.owners or not any(r.owners):
        return {}
    owners = np.array(r.owners)
    jct = r.jct
    rel = jct / r.duration
    tot = sum(r.owner_gpu_s.values())
    per: dict[str, dict[str, float]] = {}
    for o in sorted(set(r.owners)):
        m = owners == o
        per[o] = {"jobs": int(m.sum()), "avg_jct_s": float(jct[m].mean()),
                  "mean_slowdown": float(rel[m].mean()),
                  "gpu_share": float(r.owner_gpu_s.get(o, 0.0) / tot) if tot > 0 else 0.0}
    out: dict[str, object] = {
        "owners": per, "jain_slowdown": jain([v["mean_slowdown"] for v in per.values()]),
        "reclaims": r.reclaims, "reclaim_lost_gpu_s": r.reclaim_lost_gpu_s}
    if r.priority is not None and r.first_start is not None and len(set(r.priority)) > 1:
        delay = r.first_start - r.submit
        pri: dict[str, dict[str, float]] = {}
        for p in sorted(set(int(x) for x in r.priority), reverse=True):
            m = r.priority == p
            name = {100: "high", 0: "normal", -100: "low"}.get(p, str(p))
            pri[name] = {"jobs": int(m.sum()), "avg_jct_s": float(jct[m].mean()),
                         "avg_queue_delay_s": float(delay[m].mean()),
                         "restarts_per_job": float(r.restarts[m].mean())}
        out["priorities"] = pri
        out["preemptions"] = r.preemptions
        out["preempt_lost_gpu_s"] = r.preempt_lost_gpu_s
    return out


def relative_jct(r: SimResult) -> np.ndarray:
    """Per-job JCT / run time alone on a full GPU."""
    return r.jct / r.duration
