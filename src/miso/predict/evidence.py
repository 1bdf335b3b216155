"""Predict a job's speed on every slice from whatever miso has of it (pure, no I/O).

Evidence per job: an MPS profile at any non-empty subset of the levels 100/50/14 % (missing
levels imputed by :mod:`miso.predict.levels`), speeds measured on MIG slices it has run on, or
nothing. Jobs with a profile are predicted together as one mix; a job without one starts from
the training population's mean and spread. Each job's measured slices then condition all its
other slices (:func:`miso.predict.uncertainty.condition`): after one measured slice, the rest
are predicted from that measurement too, with narrower intervals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from miso.predict.data import MAX_JOBS, SLICES, DataError, speeds_to_normalised
from miso.predict.levels import impute_profile
from miso.predict.oneslice import blend, own_features
from miso.predict.prediction import A100_40GB_PROFILES, Prediction, Profile, slice_fits
from miso.predict.uncertainty import Calibration, condition

if TYPE_CHECKING:
    from miso.predict.predictor import Predictor


@dataclass(frozen=True)
class JobEvidence:
    """Whatever miso has measured of one job, for :func:`predict_from_evidence`.

    ``mps``: raw throughputs (any positive unit) at the MPS levels profiled, {100: r, 14: r},
    any non-empty subset of 100/50/14, measured together with the other jobs given with a
    profile; ``slices``: measured speeds relative to the full GPU on MIG slices the job ran on,
    {compute slices: speed}; ``memory_gb``: its memory need (slices too small get no speed).
    """

    mps: Mapping[int, float] | None = None
    slices: Mapping[int, float] | None = None
    memory_gb: float | None = None


def _three_levels(rates: Mapping[int, float]) -> tuple[float, float, float]:
    """Rates at (100, 50, 14) % from any non-empty subset (100 missing: from the training
    mean ratio of the level that is there)."""
    from miso.predict.levels import FITTED

    by = {int(k): float(v) for k, v in rates.items()}
    if not by or not set(by) <= {100, 50, 14}:
        raise DataError(f"MPS levels must be a non-empty subset of 100/50/14, got {sorted(by)}")
    if any(not np.isfinite(v) or v <= 0 for v in by.values()):
        raise DataError("MPS rates must be finite and positive")
    if 100 not in by:
        by[100] = by[50] / np.exp(FITTED.c50) if 50 in by else by[14] / np.exp(FITTED.c14)
    levels = tuple(by)
    return impute_profile(levels, [by[k] for k in levels])


def predict_from_evidence(
    pred: Predictor,
    jobs: Sequence[JobEvidence],
    profiles: Sequence[Profile] = A100_40GB_PROFILES,
) -> Prediction:
    """Speeds (and calibrated intervals) of ``jobs`` on every slice from their evidence."""
    if not jobs:
        raise DataError("no jobs to predict")
    n = len(jobs)
    mems = [j.memory_gb for j in jobs]
    with_mps = [i for i, j in enumerate(jobs) if j.mps]
    if len(with_mps) > MAX_JOBS:
        raise DataError(f"at most {MAX_JOBS} jobs of one mix have an MPS profile")
    sp = np.zeros((1, n, 2))
    cals: list[Calibration | None] = [pred.calibration] * n
    if pred.prior is not None:
        sp[0] = pred.prior[0]
    own = np.full((n, 5), np.nan)
    if with_mps:
        raw = np.array([_three_levels(jobs[i].mps) for i in with_mps]).T  # 3, m
        pm = pred.predict(raw)
        sp[0, with_mps] = pm.speed[:, 1:3]
        own[with_mps] = own_features(speeds_to_normalised(raw))
    for i in set(range(n)) - set(with_mps):
        cals[i] = pred.prior[1] if pred.prior is not None else None
    speed = np.empty((n, len(SLICES)))
    half = np.empty_like(speed)
    observed = np.zeros(speed.shape, dtype=bool)
    for i, job in enumerate(jobs):
        one = pred.to_prediction(sp[:, i:i + 1], [None], tuple(profiles), cals[i])
        speed[i], half[i] = one.speed[0], 1.96 * one.std[0]  # hi is clipped at 1
        obs = {int(g): float(v) for g, v in (job.slices or {}).items()}
        for g, v in obs.items():
            if g not in SLICES:
                raise DataError(f"measured slice count {g} not in {SLICES}")
            if not np.isfinite(v) or v <= 0:
                raise DataError(f"measured speed on {g}g must be positive, got {v}")
            observed[i, SLICES.index(g)] = True
        cal = cals[i]
        if obs and cal is not None:
            m, h = condition(speed[i, 1:], cal, obs)
            m = blend(m, getattr(pred, "curves", None), own[i], obs,  # + similar workloads
                      memory_gb=job.memory_gb)
            speed[i, 1:], half[i, 1:] = m, h
        elif obs:
            for g, v in obs.items():
                speed[i, SLICES.index(g)] = min(v, 1.0)
                half[i, SLICES.index(g)] = 0.0
        half[i, 0] = 0.0
        speed[i, 0] = 1.0
    speed = np.where(slice_fits(mems, tuple(profiles)), speed, np.nan)
    return Prediction(speed=speed, std=half / 1.96, memory_gb=mems, profiles=tuple(profiles),
                      observed=observed, lo=np.clip(speed - half, 0.0, 1.0),
                      hi=np.clip(speed + half, 0.0, 1.0), calibration=pred.calibration)

