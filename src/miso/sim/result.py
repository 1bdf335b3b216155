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

    @property
    def jct(self) -> np.ndarray:
        return self.finish - self.submit
