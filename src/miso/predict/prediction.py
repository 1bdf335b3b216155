"""What a prediction is: per job, speed relative to the full GPU on every compute-slice count,
with its interval, mapped to a GPU model's profiles, and corrected by observed speeds.

Made by :class:`miso.predict.predictor.Predictor`; plain numpy, no model files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from miso.predict.data import SLICES, DataError
from miso.predict.uncertainty import Calibration, condition

#: A GPU profile as plain data: (profile name, compute slices, memory GiB).
Profile = tuple[str, int, float]

#: MIG profiles of the A100-SXM4-40GB with the memory usable by a job.
A100_40GB_PROFILES: tuple[Profile, ...] = (
    ("7g.40gb", 7, 39.25),
    ("4g.20gb", 4, 19.5),
    ("3g.20gb", 3, 19.5),
    ("2g.10gb", 2, 9.62),
    ("1g.5gb", 1, 4.75),
)


def _slice_speed(by_slices: Mapping[int, float | None], g: int) -> float | None:
    """Speed for a compute-slice count; counts not in (7, 4, 3, 2, 1) interpolate linearly."""
    if g in by_slices:
        return by_slices[g]
    known = sorted(k for k, v in by_slices.items() if v is not None)
    if not known or g < known[0] or g > max(known):
        return None
    lo = max(k for k in known if k < g)
    hi = min(k for k in known if k > g)
    vlo, vhi = by_slices[lo], by_slices[hi]
    assert vlo is not None and vhi is not None
    return vlo + (vhi - vlo) * (g - lo) / (hi - lo)


def map_to_profiles(
    by_slices: Mapping[int, float | None],
    profiles: Sequence[Profile],
    memory_gb: float | None = None,
) -> dict[str, float | None]:
    """Map one job's {compute slices: speed} to {profile name: speed} for a GPU model.

    ``profiles`` are plain (name, compute slices, memory GiB) tuples; a profile whose memory is
    below ``memory_gb`` gets None. Speeds are relative to the full GPU of the same model (the
    A100 relative speeds are reused by compute-slice count, an approximation for other models).
    """
    out: dict[str, float | None] = {}
    for name, g, mem in profiles:
        if memory_gb is not None and memory_gb > mem:
            out[name] = None
        else:
            out[name] = _slice_speed(by_slices, int(g))
    return out


@dataclass
class Prediction:
    """Speeds of n jobs on every compute-slice count, relative to the full GPU."""

    speed: np.ndarray  # (n, 5) in SLICES order; NaN where the job does not fit
    std: np.ndarray  # (n, 5) uncertainty (ensemble std + linear-model residual for 2g/1g)
    memory_gb: list[float | None]
    profiles: tuple[Profile, ...] = A100_40GB_PROFILES
    observed: np.ndarray = field(default=None)  # type: ignore[assignment]  # (n, 5) bool
    #: (n, 5) bounds of the interval (``calibration.level``, default 95 %); speed +/- 1.96 std
    #: when not given
    lo: np.ndarray = field(default=None)  # type: ignore[assignment]
    hi: np.ndarray = field(default=None)  # type: ignore[assignment]
    #: the held-out calibration behind lo/hi (None: uncalibrated ensemble spread)
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        if self.observed is None:
            self.observed = np.zeros(self.speed.shape, dtype=bool)
        if self.lo is None or self.hi is None:
            self.lo = np.clip(self.speed - 1.96 * self.std, 0.0, 1.0)
            self.hi = np.clip(self.speed + 1.96 * self.std, 0.0, 1.0)

    @property
    def n_jobs(self) -> int:
        return self.speed.shape[0]

    def by_slices(self) -> list[dict[int, float | None]]:
        """Per job {7: 1.0, 4: .., 3: .., 2: .., 1: ..}; None where the job does not fit."""
        return [
            {g: (None if np.isnan(v) else float(v)) for g, v in zip(SLICES, row, strict=True)}
            for row in self.speed
        ]

    def std_by_slices(self) -> list[dict[int, float | None]]:
        return [
            {
                g: (None if np.isnan(v) else float(s))
                for g, v, s in zip(SLICES, row, srow, strict=True)
            }
            for row, srow in zip(self.speed, self.std, strict=True)
        ]

    def intervals(self) -> list[dict[int, tuple[float, float, float] | None]]:
        """Per job {slices: (speed, lo, hi)}: the prediction and its interval (95 % for the
        shipped model, calibrated on model families it never saw); None where it does not fit."""
        return [
            {g: (None if np.isnan(v) else (float(v), float(a), float(b)))
             for g, v, a, b in zip(SLICES, row, lrow, hrow, strict=True)}
            for row, lrow, hrow in zip(self.speed, self.lo, self.hi, strict=True)
        ]

    def by_profile(
        self, profiles: Sequence[Profile] | None = None
    ) -> list[dict[str, float | None]]:
        """Per job {profile name: speed}; defaults to the GPU model given at prediction time."""
        profs = tuple(profiles) if profiles is not None else self.profiles
        return [
            map_to_profiles(d, profs, mem)
            for d, mem in zip(self.by_slices(), self.memory_gb, strict=True)
        ]


def slice_fits(mems: Sequence[float | None], profiles: Sequence[Profile]) -> np.ndarray:
    """(n, 5) bool: whether each job's memory fits each compute-slice count's largest profile."""
    slice_mem = {g: max(m for _, gg, m in profiles if gg == g) for _, g, _ in profiles}
    return np.array([[mem is None or slice_mem.get(g) is None or mem <= slice_mem[g]
                      for g in SLICES] for mem in mems], dtype=bool).reshape(len(mems),
                                                                             len(SLICES))


def correct(pred: Prediction, job: int, observed: Mapping[int, float]) -> Prediction:
    """:meth:`miso.predict.predictor.Predictor.correct` (see there)."""
    if not 0 <= job < pred.n_jobs:
        raise DataError(f"job index {job} out of range for {pred.n_jobs} jobs")
    if pred.calibration is not None:
        return condition_job(pred, job, observed)
    speed = pred.speed.copy()
    std = pred.std.copy()
    obs = pred.observed.copy()
    row = speed[job]
    anchors: dict[int, float] = {7: 0.0}
    for g, v in observed.items():
        if g not in SLICES:
            raise DataError(f"observed slice count {g} not in {SLICES}")
        i = SLICES.index(g)
        if not np.isfinite(v) or v <= 0:
            raise DataError(f"observed speed on {g}g must be positive, got {v}")
        if np.isnan(row[i]):
            raise DataError(f"job {job} does not fit a {g}g slice; cannot observe it there")
        if g != 7:
            anchors[g] = float(np.log(min(v, 1.0) / row[i]))
    ks = sorted(anchors)
    logr = np.interp(np.array(SLICES, dtype=float), ks, [anchors[k] for k in ks])
    new = row * np.exp(logr)
    for g, v in observed.items():
        i = SLICES.index(g)
        new[i] = 1.0 if g == 7 else min(v, 1.0)
        obs[job, i] = True
    new = np.clip(new, 0.01, 1.0)
    # restore monotonicity around fixed observations: above an observation >=, below <=
    fixed = obs[job]
    for i in range(len(SLICES)):
        if not fixed[i] or np.isnan(new[i]):
            continue
        for j2 in range(len(SLICES)):
            if fixed[j2] or np.isnan(new[j2]):
                continue
            if j2 < i:
                new[j2] = max(new[j2], new[i])
            else:
                new[j2] = min(new[j2], new[i])
    free = ~fixed & ~np.isnan(new)
    vals = new.copy()
    vals[np.isnan(vals)] = np.inf
    new = np.where(free, np.minimum.accumulate(vals), new)
    new[np.isnan(row)] = np.nan
    speed[job] = new
    std[job] = np.where(fixed, 0.0, std[job] * 0.5)
    return replace(pred, speed=speed, std=std, observed=obs)


def condition_job(pred: Prediction, job: int, observed: Mapping[int, float]) -> Prediction:
    """:func:`correct` for a calibrated prediction (Gaussian conditioning)."""
    assert pred.calibration is not None
    row = pred.speed[job]
    obs: dict[int, float] = {}
    for g, v in observed.items():
        if g not in SLICES:
            raise DataError(f"observed slice count {g} not in {SLICES}")
        if not np.isfinite(v) or v <= 0:
            raise DataError(f"observed speed on {g}g must be positive, got {v}")
        if np.isnan(row[SLICES.index(g)]):
            raise DataError(f"job {job} does not fit a {g}g slice; cannot observe it there")
        obs[int(g)] = float(v)
    known = {g: float(row[SLICES.index(g)]) for g in SLICES
             if g != 7 and pred.observed[job, SLICES.index(g)]}
    half_now = 1.96 * pred.std[job]  # (hi is clipped at 1)
    prior = np.where(np.isnan(row[1:]), 0.5, row[1:])
    m, h = condition(prior, pred.calibration, {**known, **obs})
    h = np.minimum(h, half_now[1:])  # never wider than before
    speed, lo, hi = pred.speed.copy(), pred.lo.copy(), pred.hi.copy()
    std, seen = pred.std.copy(), pred.observed.copy()
    new = np.concatenate([[1.0], m])
    new[np.isnan(row)] = np.nan
    speed[job] = new
    half = np.concatenate([[0.0], h])
    lo[job], hi[job] = np.clip(new - half, 0.0, 1.0), np.clip(new + half, 0.0, 1.0)
    std[job] = half / 1.96
    for g in obs:
        seen[job, SLICES.index(g)] = True
    return replace(pred, speed=speed, std=std, observed=seen, lo=lo, hi=hi)
