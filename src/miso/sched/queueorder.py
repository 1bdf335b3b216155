"""The queue order (issue 27): which queued job is offered to the policy first, written once
for the state's FIFO queue and tenancy's ranked order.

Two rules, in this precedence:

1. **replica-first**: jobs ``ahead`` (a service's replica jobs,
   :attr:`~miso.sched.events.JobSpec.ahead`; :mod:`miso.sched.replicaroom`) before every other
   queued job, in their own order;
2. then either **FIFO** (submission time, then job id): the state's queue
   (:attr:`~miso.sched.state.JobState.queue_key`, :meth:`ClusterState._to_queue`), or
   **tenancy's rank** (priority, fair share, FIFO within an owner:
   :func:`miso.sched.fairorder.ranked`, which ends with :func:`replicas_first`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.state import JobState


def fifo_key(js: JobState) -> tuple[bool, float, str]:
    """A job's place in the FIFO queue: jobs ``ahead`` first, then submission order."""
    return (not js.spec.ahead, js.submitted_at, js.spec.id)


def replicas_first(order: list[str], jobs: Mapping[str, JobState]) -> list[str]:
    """``order`` with the jobs ``ahead`` moved before the others (a stable sort: each group
    keeps its order); ``order`` itself when none is ahead."""
    if any(jobs[j].spec.ahead for j in order):
        return sorted(order, key=lambda x: not jobs[x].spec.ahead)
    return order
