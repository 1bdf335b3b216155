"""Figures of a predictor on a file of MPS/MIG pairs: what ``miso predictor eval`` reports.

* ``mae``: mean absolute error over all outputs in the file's normalised units, the file's
  measured padding columns fed as they are (the paper's figure).
* ``mae_live``: the same with the padding columns replaced by what the live predictor pads with
  (:data:`miso.predict.DUMMY`; a per-job model ignores padding), i.e. what a real mix gets.
* ``speed_mae``: mean absolute error of real jobs' speeds relative to the full GPU, per slice
  (4g, 3g: the file's slices; 7g is 1 by definition) and over both.
* ``coverage_95``: fraction of real jobs' true 4g/3g speeds inside the predicted interval.

Padding columns are recognised by the padding job's constant MIG column. Pure: arrays in, a
dict out.
"""

from __future__ import annotations

import numpy as np

from miso.predict.data import DUMMY, PairData, dummy_columns

#: the file's slices other than the full GPU, with their column in Prediction.speed
FILE_SLICES: tuple[tuple[str, int], ...] = (("4g", 1), ("3g", 2))


def true_speeds(mig: np.ndarray, real: np.ndarray) -> np.ndarray:
    """(n, 2) speeds on 4g/3g of the real columns of (N, 3, 7) MIG times (row order)."""
    mg = np.asarray(mig, dtype=np.float64).transpose(0, 2, 1)[np.asarray(real, dtype=bool)]
    return np.stack([mg[:, 0] / mg[:, 1], mg[:, 0] / mg[:, 2]], axis=1)


def speed_mae(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """Per-slice and overall MAE of (n, 2) predicted vs true 4g/3g speeds."""
    e = np.abs(np.asarray(pred, dtype=np.float64) - np.asarray(true, dtype=np.float64))
    out = {name: float(e[:, i].mean()) for i, (name, _) in enumerate(FILE_SLICES)}
    out["all"] = float(e.mean())
    return out


def coverage(true: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> dict[str, float]:
    """Fraction of true values within [lo, hi], per column (4g, 3g) and overall."""
    t = np.asarray(true, dtype=np.float64)
    inside = (t >= np.asarray(lo) - 1e-12) & (t <= np.asarray(hi) + 1e-12)
    out = {name: float(inside[:, i].mean()) for i, (name, _) in enumerate(FILE_SLICES)}
    out["all"] = float(inside.mean())
    return out


def evaluate(pred, d: PairData, mask: np.ndarray | None = None) -> dict:  # noqa: ANN001
    """All four figures of ``pred`` (a :class:`miso.predict.Predictor`) on ``d``.

    ``mask`` (N, 7) restricts the speed figures to some real columns (e.g. a held-out family);
    ``mae``/``mae_live`` then also count only those columns.
    """
    real = ~dummy_columns(d.mig)
    sel = real if mask is None else (real & np.asarray(mask, dtype=bool))
    measured = pred.predict_mig_normalised(d.mps, real=real)
    live_in = np.where(real[:, None, :], d.mps, DUMMY[None, :, None])
    live = pred.predict_mig_normalised(live_in, real=real)
    err, err_live = np.abs(measured - d.mig), np.abs(live - d.mig)
    if mask is not None:
        err, err_live = err.transpose(0, 2, 1)[sel], err_live.transpose(0, 2, 1)[sel]
    p = pred.live_speeds(d.mps, real)
    keep = sel[real]
    cols = [i for _, i in FILE_SLICES]
    truth = true_speeds(d.mig, sel)
    sp = speed_mae(p.speed[keep][:, cols], truth)
    cov = coverage(truth, p.lo[keep][:, cols], p.hi[keep][:, cols])
    return {
        "mae": round(float(err.mean()), 6),
        "mae_live": round(float(err_live.mean()), 6),
        "speed_mae": {k: round(v, 6) for k, v in sp.items()},
        "coverage_95": round(cov["all"], 4),
        "coverage_95_by_slice": {k: round(v, 4) for k, v in cov.items() if k != "all"},
        "samples": len(d),
        "real_jobs": int(sel.sum()),
    }
