"""Speed estimators for the live controller (which one a policy gets), built by name.

* ``predictor`` / ``auto``: the learned MPS->MIG predictor of :mod:`miso.predict` behind
  :class:`miso.sched.PredictorEstimator`, when a trained model is available; otherwise
  :class:`MpsProfileHeuristic` (a logged fallback).
* ``heuristic``: :class:`MpsProfileHeuristic` only.
* ``true``: ground truth from the workload catalogue (jobs must name a workload).
* ``noisy``: ground truth plus the paper's predictor error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from miso.mig import Geometry
from miso.sched import JobState, NoisyOracle, PredictorEstimator, TrueSpeeds

log = logging.getLogger(__name__)


class MpsProfileHeuristic:
    """Relative speed on a slice of ``g`` of ``G`` compute slices, read straight off the MPS
    profile: piecewise linear through (14 %, r14/ref), (50 %, r50/ref), (100 %, 1), where ``ref``
    is the job's best profiled rate. Crude; used only when no trained predictor is installed.
    """

    needs_profile = True

    def estimate(self, geom: Geometry, jobs: Sequence[JobState],
                 profile: Mapping[str, tuple[float, ...]] | None = None
                 ) -> dict[str, dict[str, float]]:
        if profile is None:
            raise ValueError("the heuristic needs an MPS profile of the mix")
        full = geom.model.full_profile()
        out: dict[str, dict[str, float]] = {}
        for js in jobs:
            r = list(profile.get(js.id, ()))
            ref = max(r) if r and max(r) > 0 else 1.0
            pts = [(0.0, 0.0)]
            if len(r) >= 3:
                pts += [(0.14, r[2] / ref), (0.5, max(r[1], r[2]) / ref)]
            pts.append((1.0, 1.0))
            sp: dict[str, float] = {}
            for p in geom.profiles:
                if p.memory_gib + 1e-9 < js.spec.memory_gb:
                    continue
                x = p.compute_slices / full.compute_slices
                for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
                    if x0 <= x <= x1:
                        y = y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
                        sp[p.name] = min(1.0, max(0.01, y))
                        break
            sp[full.name] = 1.0
            out[js.id] = sp
        return out


def load_predictor() -> Any | None:
    """The packaged MPS->MIG predictor (``miso.predict.Predictor.load()``, shipped weights),
    as :class:`miso.sched.PredictorEstimator` takes it, or None."""
    try:
        from miso.predict import Predictor  # noqa: PLC0415

        pred = Predictor.load()
    except Exception as e:  # noqa: BLE001 - optional component (weights may be missing)
        log.info("MPS->MIG predictor unavailable: %s", e)
        return None

    return pred  # PredictorEstimator reads its speeds and their uncertainty


def make_estimator(name: str) -> Any:
    """Build the estimator ``name`` (see the module docstring)."""
    if name == "true":
        return TrueSpeeds()
    if name == "noisy":
        return NoisyOracle()
    if name == "heuristic":
        return MpsProfileHeuristic()
    if name in ("auto", "predictor"):
        p = load_predictor()
        if p is not None:
            return PredictorEstimator(p)
        if name == "predictor":
            raise RuntimeError("no trained MPS->MIG predictor is installed (miso.predict)")
        log.warning("no trained predictor found: using the MPS-profile heuristic")
        return MpsProfileHeuristic()
    raise ValueError(f"unknown estimator {name!r}: auto, predictor, heuristic, true, noisy")
