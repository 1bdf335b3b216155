"""What one simulator run returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SimResult:
    """Per-job outcomes and cluster figures of one run."""

    policy: str
    job_ids: list[str]
    submit: np.ndarray
    finish: np.ndarray
    duration: np.ndarray
    restarts: np.ndarray
    busy_gpu_s: float
    n_gpus: int
    events: int
    decisions: int
    wall_s: float = 0.0
    log: list[tuple[float, object]] = field(default_factory=list)
    lost_gpu_s: float = 0.0
    profiling_gpu_s: float = 0.0
    #: tenancy (:mod:`miso.sched.tenancy`): each job's owner and priority, when it first ran,
    #: each owner's GPU-equivalent-seconds, their GPU-equivalents in use over time, and
    #: preemptions with the GPU time they threw away
    owners: list[str] = field(default_factory=list)
    priority: np.ndarray | None = None
    first_start: np.ndarray | None = None
    owner_gpu_s: dict[str, float] = field(default_factory=dict)
    owner_usage: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    preemptions: int = 0
    preempt_lost_gpu_s: float = 0.0
    #: jobs requeued by fair share's reclaim (:mod:`miso.sched.policies.reclaim`), GPU time lost
    reclaims: int = 0
    reclaim_lost_gpu_s: float = 0.0
    #: reclaims counted once per job they were for, and those that left that job no faster
    #: (its next slice no larger than its packed share; :mod:`miso.sched.policies.reclaim`)
    reclaim_events: int = 0
    reclaims_useless: int = 0
    #: GPUs each job asked for (gangs > 1) and the GPU-seconds of GPUs holding no job while
    #: a gang waited (fragmentation: :mod:`miso.sched.gangs`)
    num_gpus: np.ndarray | None = None
    gang_idle_gpu_s: float = 0.0

    @property
    def jct(self) -> np.ndarray:
        return self.finish - self.submit
