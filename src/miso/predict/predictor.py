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
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from miso.predict.data import (
    DUMMY,
    DUMMY_MIG,
    MAX_JOBS,
    DataError,
    canonical_order,
    pad_mix,
    speeds_to_normalised,
    validate_normalised,
)
from miso.predict.lowslice import LowSliceModel, fit_lowslice
from miso.predict.numpy_unet import NumpyEnsemble
from miso.predict.oneslice import SliceCurves
from miso.predict.perjob import PerJobModel
from miso.predict.prediction import (
    A100_40GB_PROFILES,
    Prediction,
    Profile,
    correct,
    slice_fits,
)
from miso.predict.uncertainty import VAR_SLICES, Calibration

if TYPE_CHECKING:
    from miso.predict.evidence import JobEvidence

WEIGHTS_FILE = "unet_ensemble.npz"
PERJOB_FILE = "perjob.npz"
#: default tolerance of the dummy-column snap in :meth:`Predictor.predict_mig_normalised`
#: (chosen on the grouped validation split, benchmarks/README.md).
SNAP_DUMMY_TOL = 0.03
META_FILE = "meta.json"


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
        curves = meta.get("curves")
        #: known workloads' slice curves, for a job's other slices after one measured slice
        self.curves = SliceCurves.from_dict(curves) if isinstance(curves, dict) else None

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
        return correct(pred, job, observed)


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
