"""The one rule for an MPS profile level without a usable reading.

A profiling run may leave a level without a positive rate (a short window on a busy node, a
job still starting, a job that made no progress there). So that one bad reading cannot stall a
GPU, such a level is taken to be as slow as the job's slowest positive reading (never faster
than anything measured); a job with no positive reading at all gets a flat profile (1.0 at
every level). The live executor applies it when it reports a profiling run, the predictor
estimator to any profile it is handed. Levels that were never *asked* (miso+ profiles 14 % and
100 % only) are a different matter: the predictor imputes them (:mod:`miso.predict.levels`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def usable(rate: float | None) -> bool:
    """A reading a predictor can take: finite and positive."""
    return rate is not None and math.isfinite(rate) and rate > 0


def fill_missing_levels(rates: Sequence[float | None]) -> tuple[float, ...]:
    """``rates`` (one per level, None or non-positive = no reading) with the gaps filled by
    the rule in the module docstring."""
    good = [float(r) for r in rates if usable(r)]
    fill = min(good) if good else 1.0
    return tuple(float(r) if usable(r) else fill for r in rates)  # type: ignore[arg-type]
