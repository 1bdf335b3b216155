"""MPS speed physics: how fast a catalogue workload runs under MPS next to co-runners.

The one model of MPS speeds, used by the simulator (MPS-only runs and profiling runs,
:mod:`miso.sim.engine`, :mod:`miso.sim.profiling`) and by the emulated workload on the
emulated GPU backend (:mod:`miso.emuworkload`), so a simulated and an emulated job under MPS
run at the same speed.

Model: with ``n`` jobs on one GPU, each at active-thread level ``L`` %, a job gets
``min(L/100, 1.5/n)`` of the SMs (``L/100`` alone), runs at the catalogue's speed for that SM
share (:meth:`~miso.workloads.Workload.speed_at`) and is slowed by ``1 + penalty * (n - 1)``
for co-location (the MISO artifact's MPS-only penalty, 0.15 per extra job). Only the number of
co-runners matters, not which workloads they are.

It is coarse: on the MISO A100 MPS profiles its normalised profile is off by 0.154 on average
(a constant mean profile: 0.180); see benchmarks/README.md ("One MPS speed model").
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING

from miso.workloads import catalogue

if TYPE_CHECKING:
    import numpy as np

#: Slowdown per extra co-located job under MPS (the MISO artifact's value).
DEFAULT_PENALTY = 0.15
#: The levels of a MISO MPS profile (active-thread %), in the predictor's order.
PROFILE_LEVELS = (100, 50, 14)


@cache
def sm_fraction_speed(workload: str, frac: float) -> float:
    """Speed (vs the full GPU) with a fraction ``frac`` of the SMs, interpolated in the A100
    slice table (7 slices = all SMs)."""
    return max(1e-3, min(1.0, catalogue()[workload].speed_at(7.0 * frac)))


def mps_speed(workload: str, level_pct: float, n_jobs: int,
              penalty: float = DEFAULT_PENALTY) -> float:
    """Speed (vs alone on the full GPU) of ``workload`` at active-thread ``level_pct`` % with
    ``n_jobs`` jobs (itself included) on the GPU, all at that level."""
    if not 0 < level_pct <= 100:
        raise ValueError(f"level_pct must be in (0, 100], got {level_pct}")
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    frac = min(level_pct / 100.0, 1.5 / n_jobs) if n_jobs > 1 else level_pct / 100.0
    return sm_fraction_speed(workload, frac) / (1.0 + penalty * (n_jobs - 1))


def mix_speeds(workloads: Sequence[str], levels: Sequence[int],
               penalty: float = DEFAULT_PENALTY) -> list[tuple[float, ...]]:
    """Speeds of each job of a mix at each level (a profiling run: all jobs at one level)."""
    n = len(workloads)
    return [tuple(mps_speed(w, lv, n, penalty) for lv in levels) for w in workloads]


def measured_profile(workloads: Sequence[str], rng: np.random.Generator | None = None,
                     noise: float = 0.02, penalty: float = DEFAULT_PENALTY) -> np.ndarray:
    """Speeds (3, n) a profiling run at :data:`PROFILE_LEVELS` measures for a mix: the model's,
    times log-normal measurement noise of relative size ``noise`` when ``rng`` is given.
    The input of :meth:`miso.predict.Predictor.predict`."""
    import numpy as np  # noqa: PLC0415 - the emulated workload needs only mps_speed

    if not workloads:
        raise ValueError("measured_profile needs at least one workload")
    s = np.array(mix_speeds(workloads, PROFILE_LEVELS, penalty)).T
    if rng is not None and noise > 0:
        s = s * np.exp(rng.normal(0.0, noise, size=s.shape))
    return np.clip(s, 1e-4, None)
