"""Jobs' progress reports on the scheduling loop: the queue item's shapes, and a report as the
core's :class:`~miso.sched.events.JobProgress` (full-GPU seconds, :mod:`miso.sched.progress`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from miso.sched import ClusterState, JobProgress
from miso.sched.progress import full_gpu_work, slice_speed

#: One job's report: (gpu, placement, mps_pct, iterations_left, iterations/s).
Report = tuple[Any, ...]


def progress_reports(item: tuple[Any, ...],
                     take: Callable[[str], Report | None]) -> Iterator[tuple[str, Report]]:
    """The reports a ``("progress", ...)`` queue item stands for, each as (job, report).

    The runtime queues ``("progress", jobs)``, a tuple of jobs (one agent's report, or one job
    reported outside a batch): each job's latest report waiting is taken with ``take``
    (``Runtime.take_progress``: reports coalesce while they wait; a job with none waiting is
    left out; each is taken as the one before it has been handled).
    Tests and the parity driver give the values in the item itself: ``("progress", job, gpu,
    placement, mps_pct, iterations_left, rate)``."""
    if len(item) > 2:
        yield item[1], tuple(item[2:])
        return
    for job in item[1]:
        got = take(job)
        if got is not None:
            yield job, got


def job_progress(state: ClusterState, job: str, gpu: str, placement: Any,
                 mps_pct: int | None, iterations_left: float, rate: float) -> JobProgress | None:
    """A job's own report (iterations left, iterations/s on its slice) as the core's event;
    None when the job is gone or no longer on ``gpu`` (a report that came too late)."""
    js = state.jobs.get(job)
    gs = state.gpus.get(gpu) or state.gangs.gpus.get(gpu)  # or held for gangs
    if js is None or gs is None or js.gpu != gpu:
        return None
    speed = slice_speed(gs.geom, None if mps_pct is not None else placement, mps_pct,
                        js.observed)
    return JobProgress(job, full_gpu_work(iterations_left, rate, speed), speed)
