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
slices (7, 4, 3, 2, 1), NaN / None where the job's memory does not fit the slice; an ensemble
standard deviation per value; :meth:`Prediction.by_profile` maps to profile names of a GPU model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import numpy as np

from miso.predict.data import (
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

    def __post_init__(self) -> None:
        if self.observed is None:
            self.observed = np.zeros(self.speed.shape, dtype=bool)

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

    def by_profile(
        self, profiles: Sequence[Profile] | None = None
    ) -> list[dict[str, float | None]]:
        """Per job {profile name: speed}; defaults to the GPU model given at prediction time."""
        profs = tuple(profiles) if profiles is not None else self.profiles
        return [
            map_to_profiles(d, profs, mem)
            for d, mem in zip(self.by_slices(), self.memory_gb, strict=True)
        ]


def _monotone(speed: np.ndarray) -> np.ndarray:
    """Clip to (0.01, 1] and make speed non-increasing as slices shrink (7 -> 1)."""
    s = np.clip(speed, 0.01, 1.0)
    return np.minimum.accumulate(s, axis=-1)


class Predictor:
    """Ensemble of U-Nets plus the linear 2g/1g model. Load once, predict many times."""

    def __init__(
        self,
        state_dicts: list[dict[str, np.ndarray]],
        meta: dict,
        lowslice: LowSliceModel | None = None,
    ) -> None:
        self.meta = meta
        self.canonical = bool(meta.get("config", {}).get("canonical", True))
        self.snap_tol = float(meta.get("snap_dummy_tol", SNAP_DUMMY_TOL))
        self.net = NumpyEnsemble(state_dicts)
        self.lowslice = lowslice or fit_lowslice()

    # ---------------------------------------------------------------- persistence
    @classmethod
    def load(cls, path: str | Path | None = None) -> Predictor:
        """Load from a directory written by :func:`save_ensemble`; None = the shipped weights."""
        if path is None:
            base = resources.files("miso.data").joinpath("predictor")
            with resources.as_file(base.joinpath(WEIGHTS_FILE)) as wf:
                arrays = _read_npz(Path(wf))
            meta = json.loads(base.joinpath(META_FILE).read_text())
        else:
            p = Path(path)
            if not (p / WEIGHTS_FILE).is_file():
                raise DataError(f"{p}: no {WEIGHTS_FILE} (train one with `miso predictor train`)")
            try:
                arrays = _read_npz(p / WEIGHTS_FILE)
                meta = json.loads((p / META_FILE).read_text()) if (p / META_FILE).is_file() \
                    else {}
                pred = cls._from_arrays(arrays, meta)
                pred.net(np.ones((1, 3, MAX_JOBS), dtype=np.float32))  # shapes fit the net
            except Exception as exc:  # noqa: BLE001 - any damage gets one line naming the file
                raise DataError(f"{p}: not a trained predictor ({type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:200]})") from None
            return pred
        return cls._from_arrays(arrays, meta)

    @classmethod
    def _from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict) -> Predictor:
        if not isinstance(meta, dict):
            raise DataError(f"{META_FILE} holds {type(meta).__name__}, not an object")
        k = int(max(int(name.split(".", 1)[0][1:]) for name in arrays) + 1)
        sds = [
            {n.split(".", 1)[1]: a for n, a in arrays.items() if n.startswith(f"m{i}.")}
            for i in range(k)
        ]
        return cls(sds, meta)

    # ---------------------------------------------------------------- core
    def predict_members(self, mps: np.ndarray) -> np.ndarray:
        """Data convention in and out: (N, 3, 7) -> (members, N, 3, 7), input order kept."""
        x = validate_normalised(mps, "mps")
        if x.ndim != 3 or x.shape[1:] != (3, MAX_JOBS):
            raise DataError(f"mps: expected shape (N, 3, 7), got {x.shape}")
        return self._members(x)

    def _members(self, x: np.ndarray) -> np.ndarray:
        """:meth:`predict_members` on an already validated float32 (N, 3, 7) array."""
        if self.canonical:
            perm = canonical_order(x)
            x = np.take_along_axis(x, perm[:, None, :], axis=2)
        out = self.net(x)
        if self.canonical:
            inv = np.argsort(perm, axis=1)
            out = np.take_along_axis(out, inv[None, :, None, :], axis=3)
        return np.clip(out, 1e-3, 1.0)

    def predict_mig_normalised(self, mps: np.ndarray, snap: bool = True) -> np.ndarray:
        """Ensemble mean in the data convention (N, 3, 7): MIG time normalised by column max.

        With ``snap`` a predicted column within ``snap_dummy_tol`` (max-abs, from meta.json;
        default 0.03) of the padding job's known constant MIG column :data:`DUMMY_MIG` is set to
        it exactly: the file pads mixes with that job, the nearest real workload is 0.067 away,
        and the network's dummy columns are otherwise a few thousandths off.
        """
        out = self.predict_members(mps).mean(axis=0)
        if snap and self.snap_tol > 0:
            near = np.abs(out - DUMMY_MIG[None, :, None]).max(axis=1) < self.snap_tol
            out = np.where(near[:, None, :], DUMMY_MIG[None, :, None], out)
        return out

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
        members = self._members(x[None])[:, 0, :, :n]  # K, 3, n
        mems = list(memory_gb) if memory_gb is not None else [None] * n
        if len(mems) != n:
            raise DataError(f"memory_gb has {len(mems)} entries for {n} jobs")
        return self._to_prediction(members, mems, tuple(profiles))

    def _to_prediction(
        self, members: np.ndarray, mems: list[float | None], profiles: tuple[Profile, ...]
    ) -> Prediction:
        n = members.shape[2]
        m = members.astype(np.float64)
        mean = m.mean(axis=0)  # 3, n
        # rows: speeds on 4g/3g of the ensemble mean (first n) and of every member (rest)
        s43 = np.concatenate((mean[None], m))  # 1+K, 3, n
        s4a = s43[:, 0] / s43[:, 1]
        s3a = s43[:, 0] / s43[:, 2]
        low = self.lowslice.predict(s4a, s3a)
        speed = _monotone(np.stack([np.ones(n), s4a[0], s3a[0], low[2][0], low[1][0]], axis=1))
        rs = self.lowslice.resid_std
        std = np.stack(
            [
                np.zeros(n),
                s4a[1:].std(axis=0),
                s3a[1:].std(axis=0),
                np.hypot(low[2][1:].std(axis=0), rs[2]),
                np.hypot(low[1][1:].std(axis=0), rs[1]),
            ],
            axis=1,
        )
        if all(mem is None for mem in mems):
            return Prediction(speed=speed, std=std, memory_gb=mems, profiles=profiles)
        slice_mem = {g: max(m for _, gg, m in profiles if gg == g) for _, g, _ in profiles}
        for j, mem in enumerate(mems):
            if mem is None:
                continue
            for i, g in enumerate(SLICES):
                cap = slice_mem.get(g)
                if cap is not None and mem > cap:
                    speed[j, i] = np.nan
        return Prediction(speed=speed, std=std, memory_gb=mems, profiles=profiles)

    # ---------------------------------------------------------------- online correction
    @staticmethod
    def correct(pred: Prediction, job: int, observed: Mapping[int, float]) -> Prediction:
        """Fold observed speeds of one job (compute slices -> speed vs full GPU) into ``pred``.

        Observed slices take the observed value (std 0). Every other slice is scaled by the
        observed/predicted ratio, interpolated in log space between the observed slices (the
        7g anchor has ratio 1 by definition; beyond the smallest observed slice the nearest
        ratio is held); then monotonicity (faster on more slices) is restored without moving the
        observations, and the std of a corrected value shrinks by half.
        """
        if not 0 <= job < pred.n_jobs:
            raise DataError(f"job index {job} out of range for {pred.n_jobs} jobs")
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
