"""Held-out families: folds that hide every mix holding a model family, the residuals of models
trained without it, and the shipped model trained on everything with intervals calibrated on
those residuals. Pure (data in, arrays and dicts out)."""

from __future__ import annotations

import numpy as np

from miso.predict.data import PairData, dummy_columns, identify_workloads
from miso.predict.lowslice import fit_lowslice
from miso.predict.oneslice import SliceCurves, fit_curves, own_features
from miso.predict.perjob import PerJobConfig, PerJobModel, fit_perjob
from miso.predict.uncertainty import calibrate
from miso.workloads import family_of

#: at most this many held-out folds (families are dealt into folds beyond it)
MAX_FOLDS = 8


def one_per_mix(d: PairData) -> PairData:
    """The file repeats each mix with permuted columns: keep the first sample of each."""
    return d.subset(np.sort(np.unique(d.mix_id, return_index=True)[1]))


def column_groups(mig: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(N, 7) group label per column and the names: the model family of an identified MISO
    workload (``bert``), else the column's own rounded MIG triple (an unknown workload is its own
    group); padding columns get -1."""
    lab, names = identify_workloads(mig)
    real = ~dummy_columns(mig)
    keys = np.empty(lab.shape, dtype=object)
    cols = np.round(np.asarray(mig, dtype=np.float64).transpose(0, 2, 1), 3)
    for idx in zip(*np.nonzero(real), strict=True):
        w = lab[idx]
        keys[idx] = family_of(names[w]) if w >= 0 else "wl:" + ",".join(map(str, cols[idx]))
    uniq = sorted({k for k in keys[real]})
    code = {k: i for i, k in enumerate(uniq)}
    out = np.full(lab.shape, -1, dtype=np.int64)
    out[real] = [code[k] for k in keys[real]]
    return out, uniq


def folds(groups: np.ndarray, n_groups: int, max_folds: int = MAX_FOLDS) -> list[np.ndarray]:
    """Group ids per fold: one group per fold, or groups dealt round-robin into ``max_folds``."""
    ids = np.arange(n_groups)
    k = min(max_folds, n_groups)
    return [ids[i::k] for i in range(k)]


def heldout_residuals(d: PairData, cfg: PerJobConfig | None = None,
                      max_folds: int = MAX_FOLDS) -> dict[str, np.ndarray]:
    """Predictions of models trained without each fold's groups on that fold's columns.

    Returns arrays over the held-out real columns: ``pred`` (n, 2) and ``true`` (n, 2) speeds
    on 4g/3g, ``group`` (n,) and ``fold`` (n,), ``workload`` (n,) MISO catalogue index or -1.
    """
    d = one_per_mix(d)
    groups, names = column_groups(d.mig)
    real = groups >= 0
    lab, _ = identify_workloads(d.mig)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("pred", "true", "group", "fold",
                                                        "workload")}
    mg = np.asarray(d.mig, dtype=np.float64).transpose(0, 2, 1)
    truth = np.stack([mg[..., 0] / mg[..., 1], mg[..., 0] / mg[..., 2]], axis=-1)
    for f, gs in enumerate(folds(groups, len(names), max_folds)):
        col = np.isin(groups, gs)
        has = col.any(1)
        if (~has).sum() < 2:
            continue
        m = fit_perjob(d.mps[~has], d.mig[~has], real[~has], cfg)
        sp = m.predict_mix(d.mps[has], real[has]).mean(0)  # N', 7, 2
        c = col[has]
        out["pred"].append(sp[c])
        out["true"].append(truth[has][c])
        out["group"].append(groups[has][c])
        out["fold"].append(np.full(int(c.sum()), f))
        out["workload"].append(lab[has][c])
    if not out["pred"]:
        raise ValueError("too few mixes or model families to hold any out")
    return {k: np.concatenate(v) for k, v in out.items()}


def clip_speeds(pred: np.ndarray) -> np.ndarray:
    """4g/3g speeds as the predictor serves them: in (0.01, 1], 3g never above 4g."""
    p = np.clip(np.asarray(pred, dtype=np.float64), 0.01, 1.0)
    p[..., 1] = np.minimum(p[..., 1], p[..., 0])
    return p


def lowslice_residuals(pred43: np.ndarray, workload: np.ndarray) -> np.ndarray:
    """(n, 2) residuals of the 2g/1g speeds implied by predicted 4g/3g speeds, against the
    catalogue's measured 2g/1g speeds of the identified workload (NaN where unknown)."""
    from miso.predict.data import catalogue_mig_columns
    from miso.workloads import catalogue

    names, _ = catalogue_mig_columns()
    cat = catalogue()
    low = fit_lowslice().predict(pred43[:, 0], pred43[:, 1])
    res = np.full((len(pred43), 2), np.nan)
    for i, w in enumerate(workload):
        if w < 0 or w >= len(names) or names[w] not in cat:
            continue
        sp = dict(cat[names[w]].speed_by_slices)
        for j, g in enumerate((2, 1)):
            if g in sp:
                res[i, j] = low[g][i] - sp[g]
    return res


def slice_curves(d: PairData, exclude: np.ndarray | None = None) -> SliceCurves:
    """Known workloads' real slice speeds and memory needs (catalogue) and mean own MPS
    features over their columns in ``d`` (:mod:`miso.predict.oneslice`); columns where
    ``exclude`` (N, 7) is true are left out (a held-out family)."""
    from miso.workloads import catalogue

    u = np.asarray(d.mps, dtype=np.float64)
    lab, names = identify_workloads(d.mig)
    keep = lab >= 0
    if exclude is not None:
        keep &= ~np.asarray(exclude, dtype=bool)
    feats = own_features(u.transpose(1, 0, 2).reshape(3, -1)).reshape(*lab.shape, 5)
    cat = catalogue()
    by: dict[str, list[np.ndarray]] = {}
    for w in np.unique(lab[keep]):
        if names[w] in cat:
            by[names[w]] = feats[keep & (lab == w)]
    return fit_curves({w: dict(cat[w].speed_by_slices) for w in by}, by,
                      {w: cat[w].memory_gb for w in by})


def train_calibrated(d: PairData, cfg: PerJobConfig | None = None, level: float = 0.95,
                     max_folds: int = MAX_FOLDS) -> tuple[PerJobModel, dict]:
    """The per-job model on all mixes, and meta entries: its held-out calibration, the
    population prior (for jobs without a profile) and the held-out error figures."""
    cfg = cfg or PerJobConfig()
    ho = heldout_residuals(d, cfg, max_folds)
    pred = clip_speeds(ho["pred"])
    resid = pred - ho["true"]
    ls = fit_lowslice()
    low = lowslice_residuals(pred, ho["workload"])
    cal = calibrate(resid, ls.coef, ls.resid_std, level, low)
    u = one_per_mix(d)
    real = ~dummy_columns(u.mig)
    model = fit_perjob(u.mps, u.mig, real, cfg)
    mg = np.asarray(u.mig, dtype=np.float64).transpose(0, 2, 1)[real]
    y = np.stack([mg[:, 0] / mg[:, 1], mg[:, 0] / mg[:, 2]], axis=1)
    prior_mean = y.mean(0)
    prior = calibrate(y - prior_mean, ls.coef, ls.resid_std, level)
    inside = np.abs(resid) <= np.array([cal.half[4], cal.half[3]])
    meta = {
        "calibration": cal.as_dict(),
        "prior": {**prior.as_dict(), "mean": [round(float(v), 6) for v in prior_mean]},
        "curves": slice_curves(u).as_dict(),
        "heldout": {
            "folds": int(ho["fold"].max()) + 1,
            "columns": len(resid),
            "speed_mae": {"4g": round(float(np.abs(resid[:, 0]).mean()), 5),
                          "3g": round(float(np.abs(resid[:, 1]).mean()), 5)},
            "coverage_in_sample": round(float(inside.mean()), 4),
        },
    }
    return model, meta
