"""Prior per-profile speeds for a job nobody has profiled yet: the catalogue average.

Restart-economy policies place a newcomer without stopping anyone to profile it; until its
speeds are known they plan with the average speed, per profile, of the catalogue workloads (real
A100 measurements), restricted to the profiles whose memory holds the job. The arithmetic mean
is the expected throughput; the harmonic mean (``harmonic=True``) is the speed whose time
(work / speed) is the expected time, what a plan judged by completion times needs (a fixed
mix: 1 / E[s] < E[1 / s], so the arithmetic mean makes small slices look too good).
"""

from __future__ import annotations

from functools import cache

from miso.mig import Geometry
from miso.sched.policies.base import fitting_profiles
from miso.sched.speeds import workload_speeds
from miso.workloads import catalogue


@cache
def _average(geom: Geometry, harmonic: bool = False) -> tuple[tuple[str, float], ...]:
    acc: dict[str, list[float]] = {}
    for w in catalogue().values():
        for p, s in workload_speeds(geom, w).items():
            acc.setdefault(p, []).append(s)
    if harmonic:
        return tuple((p, len(v) / sum(1.0 / x for x in v)) for p, v in acc.items())
    return tuple((p, sum(v) / len(v)) for p, v in acc.items())


def prior_speeds(geom: Geometry, memory_gb: float, harmonic: bool = False
                 ) -> dict[str, float]:
    """Catalogue-average speed (arithmetic, or ``harmonic``) on each profile of ``geom`` that
    holds ``memory_gb``."""
    return dict(_prior(geom, fitting_profiles(geom, memory_gb), harmonic))


@cache
def _prior(geom: Geometry, fits: tuple[str, ...], harmonic: bool = False
           ) -> tuple[tuple[str, float], ...]:
    fit = set(fits)
    out = {p: s for p, s in _average(geom, harmonic) if p in fit}
    full = geom.model.full_profile().name
    if full in fit:
        out[full] = 1.0
    return tuple(out.items())
