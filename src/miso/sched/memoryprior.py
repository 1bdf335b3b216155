"""A prior for jobs nobody profiled, from the catalogue workloads of similar memory (issue 19,
item 5; miso+'s ``memory_prior`` switch).

miso+ plans a newcomer it did not profile with the catalogue's average speed per slice
(:func:`miso.sched.speeds.prior_speeds`). The one thing known of every job at submission that
tells its slice curve apart is its memory: in the catalogue every workload above ~5.5 GB keeps
losing speed on small slices (3g 0.49-0.63 of the full GPU: bert, cyclegan, large transformer
batches), while the small ones range from 0.56 to 1.0. So the prior here is each slice's mean
speed over the catalogue, every workload weighted by a Gaussian kernel in log-memory
(``sigma``) around the job's memory.

A workload of the job's own model family (the part of its name before ``_``) is left out:
a live job of a new model has no family in the catalogue, and in the simulator, where a
workload's memory is fixed, the job's own curve would otherwise come back through its memory
(an identity key). Pure; cached per (geometry, memory, family).
"""

from __future__ import annotations

import math
from functools import cache

from miso.mig import Geometry
from miso.sched.speeds import workload_memory_gb, workload_speeds
from miso.workloads import catalogue, family_of

#: Kernel width in log-memory (0.25: about x1.3 memory per standard deviation); chosen on the
#: simulator (benchmarks/README.md, "Predictor, fourth pass").
SIGMA = 0.25


@cache
def _table(geom: Geometry) -> tuple[tuple[str, float, tuple[tuple[str, float], ...]], ...]:
    return tuple((family_of(n), math.log(workload_memory_gb(n)),
                  tuple(workload_speeds(geom, w).items())) for n, w in catalogue().items())


@cache
def _prior(geom: Geometry, memory_gb: float, family: str, sigma: float
           ) -> tuple[tuple[str, float], ...]:
    lm = math.log(max(memory_gb, 1e-3))
    acc: dict[str, list[float]] = {}
    for fam, lw, speeds in _table(geom):
        if fam == family:
            continue
        w = math.exp(-0.5 * ((lw - lm) / sigma) ** 2)
        for p, s in speeds:
            a = acc.setdefault(p, [0.0, 0.0])
            a[0] += w * s
            a[1] += w
    return tuple((p, a[0] / a[1]) for p, a in acc.items() if a[1] > 1e-12)


def memory_prior(geom: Geometry, base: dict[str, float], memory_gb: float, workload: str,
                 sigma: float = SIGMA) -> dict[str, float]:
    """``base`` (the catalogue prior over the profiles that hold the job) with every slice
    below the full GPU replaced by its memory-weighted catalogue mean (module docstring);
    a slice no weighted workload ran on keeps ``base``'s value."""
    if sigma <= 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    got = dict(_prior(geom, round(memory_gb, 3), family_of(workload), sigma))
    full = geom.model.full_profile().name
    return {p: v if p == full else got.get(p, v) for p, v in base.items()}
