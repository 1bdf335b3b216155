"""Plan with uncertain speeds (issue 19, item 5): pure functions on a job's speed estimates.

A predictor's 95 % interval for a model it never saw is wide (about +/- 0.2 on 4g/3g). Two
ways to decide with it, both switches of :class:`~miso.sched.policies.misoplus.MisoPlus`
(off by default: neither measurably helped in the simulator, benchmarks/README.md
"Predictor, second pass"):

* :func:`pessimistic` (``robust_risk``): plan with speeds moved ``risk`` of the way down to
  the interval's lower end on slices not measured yet, so a layout is chosen that stays good
  at the low end of what the job may do (maximin of the throughput at ``risk`` = 1).
* :func:`propagate` (``propagate_observed``, "measure first"): once a job has run on one
  slice, its other slices are moved through the cross-slice error correlation of the
  predictor's calibration (a job measured slower than predicted on 3g is slower on 4g, 2g,
  1g too), as :func:`miso.predict.evidence.predict_from_evidence` does, and the next re-plan
  uses them.
* :func:`anchored_full_rate` (``anchor_slices``): a job with an estimate but no full-GPU rate
  (a profile taken at submission, or a profiled job that never ran alone) would have its
  slice rates ignored, a raw rate being no speed without the full-GPU rate. Its first slice
  anchors one (rate / estimated speed there), so the rates on its later slices correct the
  estimate by their ratio to the first. Measured no better (benchmarks/README.md, "Predictor,
  third pass"); off by default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from miso.mig import Geometry

Speeds = dict[str, float]


def pessimistic(speeds: Mapping[str, float], interval: Mapping[str, tuple[float, float]],
                measured: Mapping[str, Any], risk: float) -> Speeds:
    """``speeds`` moved ``risk`` (0-1) of the way to each interval's lower end, except on
    measured profiles and profiles without an interval; never below 0.01."""
    if not 0.0 <= risk <= 1.0:
        raise ValueError(f"risk must be in [0, 1], got {risk}")
    out = dict(speeds)
    for p, v in speeds.items():
        iv = interval.get(p)
        if iv is None or p in measured:
            continue
        out[p] = max(0.01, v - risk * max(0.0, v - iv[0]))
    return out


def _slices(geom: Geometry) -> dict[str, int]:
    full = geom.model.full_profile()
    out = {}
    for p in geom.profiles:
        x = 7.0 * p.compute_slices / full.compute_slices
        if abs(x - round(x)) < 1e-9 and p.name != full.name:
            out[p.name] = round(x)
    return out


def propagate(geom: Geometry, speeds: Mapping[str, float], measured: Mapping[str, float],
              calibration: Any) -> Speeds:
    """Speeds on every profile after the ``measured`` ones ({profile: speed vs the full GPU}):
    the measured keep their value, the others move by the Gaussian conditional mean of the
    calibration's residual covariance (:func:`miso.predict.uncertainty.condition`). Profiles
    that map to no calibrated slice count keep the estimate (or the measurement)."""
    from miso.predict.uncertainty import VAR_SLICES, condition  # noqa: PLC0415 - numpy only

    out = dict(speeds)
    out.update({p: v for p, v in measured.items() if p in out})
    by_name = _slices(geom)
    obs = {by_name[p]: float(v) for p, v in measured.items() if p in by_name}
    if not obs or calibration is None:
        return out
    have = {by_name[p]: v for p, v in speeds.items() if p in by_name}
    cond, _ = condition(_slice_mean(have, VAR_SLICES), calibration, obs)
    for p, g in by_name.items():
        if p in out and p not in measured:
            out[p] = float(np.clip(cond[VAR_SLICES.index(g)], 0.01, 1.0))
    return out


def _slice_mean(have: Mapping[int, float], slices: Sequence[int]) -> np.ndarray:
    """The estimate per slice count of ``slices``; a slice the job does not fit interpolated
    (the largest smaller one's, else the smallest known, else 0.5) so conditioning stays
    defined."""
    mean = np.empty(len(slices))
    for i, g in enumerate(slices):
        if g in have:
            mean[i] = have[g]
        else:
            lower = [have[k] for k in have if k < g]
            mean[i] = max(lower) if lower else min(have.values(), default=0.5)
    return mean


def anchored_full_rate(rate: float, estimated_speed: float) -> float:
    """The full-GPU rate implied by a raw ``rate`` on a slice whose speed (relative to the
    full GPU) is estimated at ``estimated_speed`` (floored at 0.01)."""
    if rate < 0.0:
        raise ValueError(f"rate must be >= 0, got {rate}")
    return rate / max(estimated_speed, 0.01)
