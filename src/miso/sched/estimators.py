"""Speed estimators injected into policies: ground truth, noisy oracle, learned predictor.

* :class:`TrueSpeeds` - the job's real per-profile speeds (needs ``JobSpec.workload``); used by
  Oracle, and by the simulator as physics.
* :class:`NoisyOracle` - true speeds plus a Gaussian error of random sign, fixed per (job,
  profile) and seed; the MISO artifact's simulator model of predictor error (paper: mean 0.016,
  std 0.0032). Needs a profile to have been taken (``needs_profile``), like a real predictor.
* :class:`PredictorEstimator` - the real MPS->MIG predictor (:mod:`miso.predict`) applied to the
  raw MPS profile of the mix.
* :class:`MpsProfileHeuristic` - speeds read straight off the MPS profile (no model).

:func:`make_estimator` builds one by name for both drivers (the simulator's
``WorldConfig.predictor`` and the controller's ``--estimator``): ``true``, ``noisy``,
``heuristic``, ``predictor`` (the shipped learned model, per job), ``unet`` (the MISO paper's
U-Net ensemble, shipped beside it; both loaded once by :func:`load_predictor`) and ``auto``
(the shipped predictor, else the heuristic, logged).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np

from miso.mig import Geometry
from miso.sched.profiles import fill_missing_levels
from miso.sched.speeds import workload_speeds
from miso.sched.state import JobState
from miso.workloads import catalogue, piecewise_linear

SpeedTable = dict[str, dict[str, float]]
log = logging.getLogger(__name__)
ESTIMATORS = ("auto", "predictor", "unet", "heuristic", "true", "noisy")


def true_speeds(geom: Geometry, job: JobState) -> dict[str, float]:
    """Real speeds of a job with a known workload on ``geom``."""
    wl = job.spec.workload
    if wl is None:
        raise ValueError(f"job {job.id} has no workload: ground truth is unknown")
    return workload_speeds(geom, catalogue()[wl])


class TrueSpeeds:
    """Ground truth from the workload catalogue (no profiling needed)."""

    needs_profile = False

    def __init__(self) -> None:
        self.uncertainty: dict[str, dict[str, float]] = {}

    def estimate(self, geom: Geometry, jobs: Sequence[JobState],
                 profile: Mapping[str, tuple[float, ...]] | None = None) -> SpeedTable:
        return {j.id: true_speeds(geom, j) for j in jobs}


def clip_speed(speed: float) -> float:
    """A speed relative to the full GPU, within [0.01, 1.5]: a noisy or measured speed is
    clipped to it (:class:`NoisyOracle`, miso+'s observed rates)."""
    return max(0.01, min(1.5, speed))


class NoisyOracle:
    """True speeds + N(mean, std) error with a random sign, clipped (:func:`clip_speed`).

    The error of a (job, profile) pair is drawn from a generator seeded by ``seed`` and the job
    id, so it does not depend on call order. The full profile keeps speed 1.0 (it is the
    normalisation reference).
    """

    needs_profile = True

    def __init__(self, mean: float = 0.016, std: float = 0.0032, seed: int = 0) -> None:
        self.mean, self.std, self.seed = mean, std, seed
        self.uncertainty: dict[str, dict[str, float]] = {}
        self._cache: dict[tuple[str, str], dict[str, float]] = {}

    def estimate(self, geom: Geometry, jobs: Sequence[JobState],
                 profile: Mapping[str, tuple[float, ...]] | None = None) -> SpeedTable:
        out: SpeedTable = {}
        full = geom.model.full_profile().name
        for j in jobs:
            key = (geom.model.name, j.id)
            got = self._cache.get(key)
            if got is None:
                rng = np.random.default_rng([self.seed, zlib.crc32(j.id.encode())])
                got = {}
                for prof, s in sorted(true_speeds(geom, j).items()):
                    e = rng.normal(self.mean, self.std) * (1 if rng.random() < 0.5 else -1)
                    got[prof] = 1.0 if prof == full else clip_speed(s + e)
                self._cache[key] = got
            out[j.id] = dict(got)
        return out


def _complete_profile(raw: np.ndarray) -> np.ndarray:
    """Levels (rows) without a usable reading of each job (column) filled by the one rule of
    :func:`miso.sched.profiles.fill_missing_levels`."""
    ok = np.isfinite(raw) & (raw > 0)
    if ok.all():
        return raw
    out = raw.copy()
    for i in range(raw.shape[1]):
        out[:, i] = fill_missing_levels([float(x) for x in raw[:, i]])
    return out


class PredictorEstimator:
    """The learned MPS->MIG predictor on the mix's raw MPS profile.

    ``predictor`` is a :class:`miso.predict.Predictor` (``predict(raw (3, n))`` returning
    speeds and their uncertainty, each (n, 5)), any object with ``predict_mix(raw: ndarray (3,
    n)) -> ndarray (5, n)`` of speeds relative to the full GPU on 7/4/3/2/1 compute slices (NaN
    = unknown), or a callable of that shape. Memory fit comes from the job's ``memory_gb``;
    slices that the prediction marks unknown are dropped. ``uncertainty[job]`` holds the
    prediction's std per profile (where the predictor gives one), for explanations.
    """

    needs_profile = True
    SLICES = (7, 4, 3, 2, 1)

    def __init__(self, predictor: Any) -> None:
        self.predictor = predictor
        self.uncertainty: dict[str, dict[str, float]] = {}
        #: per job {profile: (lo, hi)}: the predictor's calibrated 95 % interval, where it has one
        self.interval: dict[str, dict[str, tuple[float, float]]] = {}
        self._bounds: tuple[np.ndarray, np.ndarray] | None = None

    def _predict(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        p = self.predictor
        self._bounds = None
        if hasattr(p, "predict_mix"):
            return np.asarray(p.predict_mix(raw)), None
        if hasattr(p, "predict") and not callable(p):
            got = p.predict(raw)
            if getattr(got, "lo", None) is not None and getattr(got, "hi", None) is not None:
                self._bounds = (np.asarray(got.lo, dtype=float).T,
                                np.asarray(got.hi, dtype=float).T)
            return np.asarray(got.speed, dtype=float).T, np.asarray(got.std, dtype=float).T
        return np.asarray(p(raw)), None

    def estimate(self, geom: Geometry, jobs: Sequence[JobState],
                 profile: Mapping[str, tuple[float, ...]] | None = None) -> SpeedTable:
        if profile is None:
            raise ValueError("the predictor needs an MPS profile of the mix")
        mix = list(profile)
        raw = _complete_profile(np.array([profile[j] for j in mix], dtype=float).T)  # (3, n)
        pred, std = self._predict(raw)
        col = {j: i for i, j in enumerate(mix)}
        out: SpeedTable = {}
        for js in jobs:
            i = col[js.id]
            sp = self._slice_speeds(geom, js, pred[:, i])
            out[js.id] = sp
            if std is not None:
                self.uncertainty[js.id] = self._slice_std(geom, sp, std[:, i])
            if self._bounds is not None:
                self.interval[js.id] = self._slice_bounds(geom, sp, i)
        return out


    def _slice_speeds(self, geom: Geometry, js: JobState, pred: np.ndarray
                      ) -> dict[str, float]:
        """A job's speed per profile of ``geom`` that holds its memory, from its predicted
        speeds on the 1g..7g slices (``pred``; between them piecewise linear)."""
        full = geom.model.full_profile()
        by = {g: float(pred[k]) for k, g in enumerate(self.SLICES)
              if np.isfinite(pred[k]) and pred[k] > 0}
        sp: dict[str, float] = {}
        for p in geom.profiles:
            if p.memory_gib + 1e-9 < js.spec.memory_gb:
                continue
            x = 7.0 * p.compute_slices / full.compute_slices
            s = by.get(round(x)) if abs(x - round(x)) < 1e-9 else None
            if s is None and by:
                s = piecewise_linear(sorted(by.items()), x)
            if s is not None:
                sp[p.name] = float(np.clip(s, 0.01, 1.5))
        sp[full.name] = 1.0
        return sp

    def _slice_std(self, geom: Geometry, sp: Mapping[str, float], std: np.ndarray
                   ) -> dict[str, float]:
        """The predictor's standard deviation per profile in ``sp`` (its slice's)."""
        full = geom.model.full_profile()
        by_std = {g: float(std[k]) for k, g in enumerate(self.SLICES) if np.isfinite(std[k])}
        return {p.name: by_std[round(7.0 * p.compute_slices / full.compute_slices)]
                for p in geom.profiles if p.name in sp
                and round(7.0 * p.compute_slices / full.compute_slices) in by_std}

    def _slice_bounds(self, geom: Geometry, sp: Mapping[str, float], i: int
                      ) -> dict[str, tuple[float, float]]:
        """The predictor's interval per profile in ``sp`` but the whole GPU (job column i)."""
        assert self._bounds is not None
        full = geom.model.full_profile()
        lo, hi = self._bounds
        ks = {g: k for k, g in enumerate(self.SLICES)}
        return {p.name: (float(lo[ks[g], i]), float(hi[ks[g], i]))
                for p in geom.profiles if p.name in sp and p.name != full.name
                and (g := round(7.0 * p.compute_slices / full.compute_slices)) in ks
                and np.isfinite(lo[ks[g], i])}


class MpsProfileHeuristic:
    """Relative speed on a slice of ``g`` of ``G`` compute slices, read straight off the MPS
    profile: piecewise linear through (14 %, r14/ref), (50 %, r50/ref), (100 %, 1), where ``ref``
    is the job's best profiled rate. Crude; used only when no trained predictor is installed.
    """

    needs_profile = True

    def __init__(self) -> None:
        self.uncertainty: dict[str, dict[str, float]] = {}

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
                y = piecewise_linear(pts, p.compute_slices / full.compute_slices)
                if y is not None:
                    sp[p.name] = min(1.0, max(0.01, y))
            sp[full.name] = 1.0
            out[js.id] = sp
        return out


@cache
def load_predictor(kind: str = "shipped") -> Any:
    """A shipped MPS->MIG predictor, loaded once per process, as :class:`PredictorEstimator`
    takes it: ``shipped`` is the default model (the per-job model,
    :meth:`miso.predict.Predictor.load`), ``unet`` the MISO paper's U-Net ensemble (kept so the
    paper's method stays reproducible). Raises when unusable."""
    from importlib import resources  # noqa: PLC0415

    from miso.predict.predictor import Predictor  # noqa: PLC0415 - torch-free but heavy

    if kind == "unet":
        base = resources.files("miso.data").joinpath("predictor", "unet")
        with resources.as_file(base) as path:
            return Predictor.load(path)
    return Predictor.load()


def make_estimator(name: str, *, seed: int = 0, error_mean: float = 0.016,
                   error_std: float = 0.0032) -> Any:
    """The estimator ``name`` (see the module docstring); ``seed`` and the error figures
    are the noisy oracle's."""
    if name == "true":
        return TrueSpeeds()
    if name == "noisy":
        return NoisyOracle(error_mean, error_std, seed)
    if name == "heuristic":
        return MpsProfileHeuristic()
    if name in ("auto", "predictor", "unet"):
        try:
            model = load_predictor("unet") if name == "unet" else load_predictor()
            return PredictorEstimator(model)
        except Exception as e:  # noqa: BLE001 - optional component (weights may be missing)
            if name != "auto":
                raise ValueError(f"estimator {name!r}: the learned predictor is not usable "
                                 f"here ({type(e).__name__}: {e})") from None
            log.warning("no trained predictor (%s): using the MPS-profile heuristic", e)
            return MpsProfileHeuristic()
    raise ValueError(f"unknown estimator {name!r}: {', '.join(ESTIMATORS)}")
