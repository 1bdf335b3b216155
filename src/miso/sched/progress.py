"""Progress in one unit: work left in seconds alone on a full GPU ("full-GPU seconds").

The simulator knows a job's work in that unit. A live job reports iterations (done, total) and
its rate in iterations/s on the slice it runs on; the live driver converts with the slice's
speed relative to the full GPU before it tells the policy (:class:`~miso.sched.events.
JobProgress`)::

    work_s = (total - iteration) / rate_on_slice * speed_of_slice

so a policy that divides by a slice's speed (miso+'s plan horizon) gets seconds on that slice
in both drivers.
"""

from __future__ import annotations

from collections.abc import Mapping

from miso.mig import Geometry, Placement


def slice_speed(geom: Geometry, placement: Placement | None, mps_pct: int | None,
                observed: Mapping[str, float]) -> float:
    """Speed of the slice a job runs on, relative to the full GPU.

    Measured when the job's steady rate has been seen both there and on the full profile
    (``observed``: profile -> first raw rate, :attr:`JobState.observed`); otherwise the
    slice's share of the GPU's compute (MPS: its active-thread share, no placement: 1).
    """
    full = geom.model.full_profile()
    if placement is None:
        return (mps_pct if mps_pct else 100) / 100.0
    here, ref = observed.get(placement.profile), observed.get(full.name)
    if here and ref:
        return min(1.0, here / ref)
    return geom.model.profile(placement.profile).compute_slices / full.compute_slices


def full_gpu_work(iterations_left: float, rate: float, speed: float) -> float:
    """Work left in full-GPU seconds, from iterations left, iterations/s on the current slice
    and that slice's relative speed."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    return max(0.0, iterations_left) / rate * speed
