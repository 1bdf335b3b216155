"""The public predictor: MPS profile of a mix -> each job's speed on every MIG slice.

Input conventions
-----------------
* :meth:`Predictor.predict` takes what the live agent measures: a (3, n) array of raw per-job
  throughputs (iterations/s, or any positive unit per job) at MPS levels 100/50/14 %, n = 1..7.
  It is converted to the data's convention ``min(speed) / speed`` per job.
* :meth:`Predictor.predict_normalised` takes the data's own convention: (3, n) per-job
  time normalised by its max, values in (0, 1].

Mixes of fewer than 7 jobs are padded with the dummy job's profile (:data:`DUMMY`), never zeros.

Output
------
A :class:`Prediction`: per job, speed relative to the full GPU (7g = 1.0) keyed by compute
slices (7, 4, 3, 2, 1), NaN / None where the job's memory does not fit the slice; a calibrated
interval per value (``lo``/``hi``, :meth:`Prediction.intervals`; ``std`` is its half-width /
1.96, or the ensemble spread for an uncalibrated model); :meth:`Prediction.by_profile` maps to
profile names of a GPU model.

Models: the shipped model is per job (:mod:`miso.predict.perjob`, file ``perjob.npz``); U-Net
ensembles (``unet_ensemble.npz``, :mod:`miso.predict.numpy_unet`) still load.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from miso.predict.data import (
    DUMMY,
    DUMMY_MIG,
    MAX_JOBS,
    SLICES,
    DataError,
    canonical_order,
    pad_mix,
    speeds_to_normalised,
    validate_normalised,
)
from miso.predict.lowslice import LowSliceModel, fit_lowslice
from miso.predict.numpy_unet import NumpyEnsemble
from miso.predict.perjob import PerJobModel
from miso.predict.uncertainty import VAR_SLICES, Calibration, condition

if TYPE_CHECKING:
    from miso.predict.evidence import JobEvidence

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

WEIGHTS_FILE = "unet_ensemble.npz"
PERJOB_FILE = "perjob.npz"
#: default tolerance of the dummy-column snap in :meth:`Predictor.predict_mig_normalised`
#: (chosen on the grouped validation split, benchmarks/README.md).
SNAP_DUMMY_TOL = 0.03
META_FILE = "meta.json"


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


def _monotone(speed: np.ndarray) -> np.ndarray:
    """Clip to (0.01, 1] and make speed non-increasing as slices shrink (7 -> 1)."""
    s = np.clip(speed, 0.01, 1.0)
    return np.minimum.accumulate(s, axis=-1)


class Predictor:
    """A trained MPS-to-MIG model (per job, or a U-Net ensemble) plus the linear 2g/1g model
    and the held-out calibration of its intervals. Load once, predict many times."""

    def __init__(
        self,
        state_dicts: list[dict[str, np.ndarray]] | None,
        meta: dict,
        lowslice: LowSliceModel | None = None,
        perjob: PerJobModel | None = None,
    ) -> None:
        self.meta = meta
        self.canonical = bool(meta.get("config", {}).get("canonical", True))
        self.snap_tol = float(meta.get("snap_dummy_tol", SNAP_DUMMY_TOL))
        if (state_dicts is None) == (perjob is None):
            raise DataError("a predictor is either a U-Net ensemble or a per-job model")
        self.net = NumpyEnsemble(state_dicts) if state_dicts is not None else None
        self.perjob = perjob
        self.lowslice = lowslice or fit_lowslice()
        cal = meta.get("calibration")
        self.calibration = Calibration.from_dict(cal) if isinstance(cal, dict) else None
        prior = meta.get("prior")
        self.prior = (np.asarray(prior["mean"], dtype=np.float64),
                      Calibration.from_dict(prior)) if isinstance(prior, dict) else None

    @property
    def kind(self) -> str:
        return "perjob" if self.perjob is not None else "unet"

    # ---------------------------------------------------------------- persistence
    @classmethod
    def load(cls, path: str | Path | None = None) -> Predictor:
        """Load from a directory written by ``miso predictor train``; None = the shipped one."""
        if path is None:
            base = resources.files("miso.data").joinpath("predictor")
            meta = json.loads(base.joinpath(META_FILE).read_text())
            name = PERJOB_FILE if base.joinpath(PERJOB_FILE).is_file() else WEIGHTS_FILE
            with resources.as_file(base.joinpath(name)) as wf:
                arrays = _read_npz(Path(wf))
            return cls._from_arrays(arrays, meta, name == PERJOB_FILE)
        p = Path(path)
        name = PERJOB_FILE if (p / PERJOB_FILE).is_file() else WEIGHTS_FILE
        if not (p / name).is_file():
            raise DataError(f"{p}: no {PERJOB_FILE} or {WEIGHTS_FILE} "
                            "(train one with `miso predictor train`)")
        try:
            arrays = _read_npz(p / name)
            meta = json.loads((p / META_FILE).read_text()) if (p / META_FILE).is_file() else {}
            pred = cls._from_arrays(arrays, meta, name == PERJOB_FILE)
            pred.predict_normalised(np.ones((3, 2), dtype=np.float32) * 0.5)  # shapes fit
        except Exception as exc:  # noqa: BLE001 - any damage gets one line naming the file
            raise DataError(f"{p}: not a trained predictor ({type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:200]})") from None
        return pred

    @classmethod
    def _from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict, perjob: bool = False
                     ) -> Predictor:
        if not isinstance(meta, dict):
            raise DataError(f"{META_FILE} holds {type(meta).__name__}, not an object")
        if perjob:
            return cls(None, meta, perjob=PerJobModel(arrays))
        k = int(max(int(name.split(".", 1)[0][1:]) for name in arrays) + 1)
        sds = [
            {n.split(".", 1)[1]: a for n, a in arrays.items() if n.startswith(f"m{i}.")}
            for i in range(k)
        ]
        return cls(sds, meta)

    # ---------------------------------------------------------------- core
    def predict_members(self, mps: np.ndarray, real: np.ndarray | None = None) -> np.ndarray:
        """Data convention in and out: (N, 3, 7) -> (members, N, 3, 7), input order kept.

        ``real`` (N, 7) marks the real jobs (default: all); a per-job model ignores the other
        columns and returns the padding job's MIG column there.
        """
        x = validate_normalised(mps, "mps")
        if x.ndim != 3 or x.shape[1:] != (3, MAX_JOBS):
            raise DataError(f"mps: expected shape (N, 3, 7), got {x.shape}")
        if self.perjob is None:
            return self._members(x)
        r = np.ones(x.shape[::2], dtype=bool) if real is None else np.asarray(real, dtype=bool)
        sp = self.perjob.predict_mix(x, r)  # K, N, 7, 2
        s4 = np.clip(sp[..., 0], 0.01, 1.0)
        s3 = np.clip(np.minimum(sp[..., 1], s4), 0.01, 1.0)
        t = np.stack([np.ones_like(s4), 1.0 / s4, 1.0 / s3], axis=2)  # K, N, 3, 7
        t = t / t.max(axis=2, keepdims=True)
        return np.where(r[None, :, None, :], t, DUMMY_MIG[None, None, :, None])

    def _members(self, x: np.ndarray) -> np.ndarray:
        """U-Net members on an already validated float32 (N, 3, 7) array."""
        assert self.net is not None
        if self.canonical:
            perm = canonical_order(x)
            x = np.take_along_axis(x, perm[:, None, :], axis=2)
        out = self.net(x)
        if self.canonical:
            inv = np.argsort(perm, axis=1)
            out = np.take_along_axis(out, inv[None, :, None, :], axis=3)
        return np.clip(out, 1e-3, 1.0)

    def predict_mig_normalised(self, mps: np.ndarray, snap: bool = True,
                               real: np.ndarray | None = None) -> np.ndarray:
        """Mean in the data convention (N, 3, 7): MIG time normalised by column max.

        With ``snap`` (U-Net only) a predicted column within ``snap_dummy_tol`` (max-abs, from
        meta.json; default 0.03) of the padding job's known constant MIG column
        :data:`DUMMY_MIG` is set to it exactly: the file pads mixes with that job, the nearest
        real workload is 0.067 away, and the network's dummy columns are a few thousandths off.
        """
        out = self.predict_members(mps, real).mean(axis=0)
        if snap and self.snap_tol > 0 and self.perjob is None:
            near = np.abs(out - DUMMY_MIG[None, :, None]).max(axis=1) < self.snap_tol
            out = np.where(near[:, None, :], DUMMY_MIG[None, :, None], out)
        return out

    def live_speeds(self, mps: np.ndarray, real: np.ndarray) -> Prediction:
        """What the live predictor says for every real job of (N, 3, 7) file mixes, as one
        :class:`Prediction` of all real columns in row order (padding as the live API pads)."""
        x = validate_normalised(mps, "mps")
        r = np.asarray(real, dtype=bool)
        if self.perjob is not None:
            sp = self.perjob.predict_mix(x, r)[:, r]  # K, n, 2
        else:
            xl = np.where(r[:, None, :], x, DUMMY[None, :, None])
            m = self._members(xl).astype(np.float64)  # K, N, 3, 7
            sp = np.stack([m[:, :, 0] / m[:, :, 1], m[:, :, 0] / m[:, :, 2]], -1)[:, r]
        return self.to_prediction(sp, [None] * int(r.sum()), A100_40GB_PROFILES)

    def predict(
        self,
        mps_speeds: np.ndarray,
        memory_gb: Sequence[float | None] | None = None,
        profiles: Sequence[Profile] = A100_40GB_PROFILES,
    ) -> Prediction:
        """Raw MPS throughputs (3, n) at 100/50/14 % (any positive unit per job) -> speeds."""
        return self.predict_normalised(speeds_to_normalised(mps_speeds), memory_gb, profiles)

    def predict_normalised(
        self,
        mps_norm: np.ndarray,
        memory_gb: Sequence[float | None] | None = None,
        profiles: Sequence[Profile] = A100_40GB_PROFILES,
    ) -> Prediction:
        """Data-convention profile (3, n), values in (0, 1] -> speeds relative to the full GPU."""
        a = np.asarray(mps_norm)
        if a.ndim != 2 or a.shape[0] != 3:
            raise DataError(f"expected an MPS profile of shape (3, n_jobs), got {a.shape}")
        n = a.shape[1]
        if not 1 <= n <= MAX_JOBS:
            raise DataError(f"a mix has 1..{MAX_JOBS} jobs, got {n}")
        x = pad_mix(validate_normalised(a, "mps"))
        mems = list(memory_gb) if memory_gb is not None else [None] * n
        if len(mems) != n:
            raise DataError(f"memory_gb has {len(mems)} entries for {n} jobs")
        if self.perjob is not None:
            real = np.arange(MAX_JOBS) < n
            sp = self.perjob.predict_mix(x[None], real[None])[:, 0, :n]  # K, n, 2
        else:
            m = self._members(x[None])[:, 0, :, :n].astype(np.float64)  # K, 3, n
            sp = np.stack([m[:, 0] / m[:, 1], m[:, 0] / m[:, 2]], axis=-1)
        return self.to_prediction(sp, mems, tuple(profiles))

    def to_prediction(
        self, sp: np.ndarray, mems: list[float | None], profiles: tuple[Profile, ...],
        cal: Calibration | None = None,
    ) -> Prediction:
        """Members' 4g/3g speeds (K, n, 2) -> a :class:`Prediction` on all five slices (the
        2g/1g linear model, monotonicity, memory fit, intervals of ``cal`` or the model's)."""
        n = sp.shape[1]
        cal = cal or self.calibration
        mean = sp.mean(axis=0)  # n, 2
        low = self.lowslice.predict(np.concatenate([mean[:, 0][None], sp[..., 0]]),
                                    np.concatenate([mean[:, 1][None], sp[..., 1]]))
        speed = _monotone(np.stack([np.ones(n), mean[:, 0], mean[:, 1], low[2][0], low[1][0]],
                                   axis=1))
        if cal is not None:
            half = np.array([0.0, *(cal.half[g] for g in VAR_SLICES)])[None].repeat(n, 0)
            std = half / 1.96
        else:
            rs = self.lowslice.resid_std
            std = np.stack([np.zeros(n), sp[..., 0].std(axis=0), sp[..., 1].std(axis=0),
                            np.hypot(low[2][1:].std(axis=0), rs[2]),
                            np.hypot(low[1][1:].std(axis=0), rs[1])], axis=1)
            half = 1.96 * std
        speed = np.where(slice_fits(mems, profiles), speed, np.nan)
        return Prediction(speed=speed, std=std, memory_gb=mems, profiles=profiles,
                          lo=np.clip(speed - half, 0.0, 1.0), hi=np.clip(speed + half, 0.0, 1.0),
                          calibration=cal)

    # ---------------------------------------------------------------- every observation
    def predict_jobs(
        self,
        jobs: Sequence[JobEvidence],
        profiles: Sequence[Profile] = A100_40GB_PROFILES,
    ) -> Prediction:
        """Speeds on every slice from whatever is known of each job: see
        :func:`miso.predict.evidence.predict_from_evidence`."""
        from miso.predict.evidence import predict_from_evidence

        return predict_from_evidence(self, jobs, profiles)

    # ---------------------------------------------------------------- online correction
    @staticmethod
    def correct(pred: Prediction, job: int, observed: Mapping[int, float]) -> Prediction:
        """Fold observed speeds of one job (compute slices -> speed vs full GPU) into ``pred``.

        A calibrated prediction (the shipped model) conditions every other slice of the job on
        the observations (:func:`miso.predict.uncertainty.condition`). Otherwise: observed
        slices take the observed value (std 0). Every other slice is scaled by the
        observed/predicted ratio, interpolated in log space between the observed slices (the
        7g anchor has ratio 1 by definition; beyond the smallest observed slice the nearest
        ratio is held); then monotonicity (faster on more slices) is restored without moving the
        observations, and the std of a corrected value shrinks by half.
        """
        if not 0 <= job < pred.n_jobs:
            raise DataError(f"job index {job} out of range for {pred.n_jobs} jobs")
        if pred.calibration is not None:
            return _condition_job(pred, job, observed)
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


def _condition_job(pred: Prediction, job: int, observed: Mapping[int, float]) -> Prediction:
    """:meth:`Predictor.correct` for a calibrated prediction (Gaussian conditioning)."""
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


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k].astype(np.float64) for k in z.files}


def save_ensemble(models: list, out_dir: str | Path, meta: dict) -> Path:
    """Write torch U-Nets as ``unet_ensemble.npz`` (float32) plus ``meta.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for i, m in enumerate(models):
        for name, t in m.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            arrays[f"m{i}.{name}"] = t.detach().cpu().numpy().astype(np.float32)
    np.savez_compressed(out / WEIGHTS_FILE, **arrays)
    (out / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def save_perjob(model: PerJobModel, out_dir: str | Path, meta: dict) -> Path:
    """Write a per-job model as ``perjob.npz`` (float64) plus ``meta.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / PERJOB_FILE, **model.a)
    (out / META_FILE).write_text(json.dumps({"kind": "perjob", **meta}, indent=2,
                                            sort_keys=True) + "\n")
    return out
