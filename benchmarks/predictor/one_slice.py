"""After one measured slice: a job's other slices on leave-one-family-out (issue 19 item 4).

usage: PYTHONPATH=src python benchmarks/predictor/one_slice.py [--data NPZ] [--seed 0]

Per-job model (shipped configuration) trained without each of the 8 model families; for every
real column of the held-out family, one slice (4g, 3g, 2g or 1g) is measured (its catalogue
speed) and the other slices are predicted seven ways: Gaussian conditioning on the covariance
of the other families' residuals (as shipped first), the slice curves of the nearest known
workloads of the other families only (:mod:`miso.predict.oneslice`) carried over as speed
ratios ("curves-ratio") and their blend ("blend-ratio", shipped by the second pass), the same
curves carried over as overhead ratios (1/s - 1, "curves") and their half-and-half blend with
the Gaussian after every measured slice ("blend-overhead": what ships for a job whose memory
need is unknown), the per-pair regression on the measured overhead and the job's memory need
over the target slice's ("memory-regression"), and the mean of the Gaussian, the curves and
the regression ("blend": what :func:`miso.predict.evidence.predict_from_evidence` does for a
job whose memory need is known; here its catalogue peak memory). speed_mae of the other slices
where the catalogue measured them, mean over families; coverage of the conditioned 95 % interval
around the blend. Data: MISO (SoCC'22, Baolin Li et al.) MPS/MIG pairs, MIT licence.
"""

from __future__ import annotations

import argparse

import numpy as np

from miso.predict.data import identify_workloads, load_pairs
from miso.predict.heldout import (
    clip_speeds,
    column_groups,
    folds,
    lowslice_residuals,
    one_per_mix,
    slice_curves,
)
from miso.predict.lowslice import fit_lowslice
from miso.predict.oneslice import BLEND_RATIO, blend, own_features
from miso.predict.perjob import PerJobConfig, fit_perjob, job_features
from miso.predict.uncertainty import VAR_SLICES, calibrate, condition
from miso.workloads import catalogue

METHODS = ("gaussian", "curves-ratio", "blend-ratio", "curves", "blend-overhead",
           "memory-regression", "blend")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/miso-a100/mps_mig_pairs.npz")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    d = one_per_mix(load_pairs(args.data))
    groups, names = column_groups(d.mig)
    lab, wnames = identify_workloads(d.mig)
    real = groups >= 0
    feats = job_features(d.mps, real)
    own = own_features(np.asarray(d.mps, dtype=np.float64).transpose(1, 0, 2).reshape(3, -1)
                       ).reshape(*real.shape, 5)
    cat = catalogue()
    truth = np.full((*real.shape, 4), np.nan)  # catalogue speeds on 4/3/2/1
    for w in np.unique(lab[lab >= 0]):
        if wnames[w] in cat:
            sp = dict(cat[wnames[w]].speed_by_slices)
            truth[lab == w] = [sp.get(g, np.nan) for g in VAR_SLICES]
    ls = fit_lowslice()
    cfg = PerJobConfig(seed=args.seed)
    rows = []  # (fold, column index) predictions
    fold_ids = folds(groups, len(names))
    pred = np.full((*real.shape, 2), np.nan)
    fold_of = np.full(real.shape, -1)
    for f, gs in enumerate(fold_ids):
        colf = np.isin(groups, gs)
        has = colf.any(1)
        m = fit_perjob(d.mps[~has], d.mig[~has], real[~has], cfg)
        p = clip_speeds(m.members(feats[has][colf[has]]).mean(0))
        idx = np.argwhere(colf)
        pred[idx[:, 0], idx[:, 1]] = p
        fold_of[colf] = f
        print(f"fold {f} ({'/'.join(names[g] for g in gs)}) trained", flush=True)
    sel = fold_of >= 0
    rows = np.argwhere(sel)
    P, T, fo = pred[sel], truth[sel], fold_of[sel]
    W = lab[sel]
    mem = np.array([cat[wnames[w]].memory_gb if w >= 0 and wnames[w] in cat else np.nan
                    for w in W])  # the job's memory need (peak memory on the full GPU)
    nf = len(fold_ids)
    print("\n| measured slice | method | 4g | 3g | 2g | 1g | other slices | coverage_95 |")
    print("|---|---|---|---|---|---|---|---|")
    for og in VAR_SLICES:
        io = VAR_SLICES.index(og)
        acc: dict[str, dict] = {k: {"g": {h: [] for h in VAR_SLICES}, "oth": [], "cov": []}
                                for k in METHODS}
        for f in range(nf):
            o = fo != f
            cal = calibrate(P[o] - T[o, :2], ls.coef, ls.resid_std, 0.95,
                            lowslice_residuals(P[o], W[o]))
            curves = slice_curves(d, exclude=fold_of == f)
            errs: dict[str, dict] = {k: {h: [] for h in VAR_SLICES} for k in acc}
            ins: list[float] = []
            for i in np.flatnonzero(fo == f):
                if not np.isfinite(T[i, io]):
                    continue
                low = ls.predict(P[i:i + 1, 0], P[i:i + 1, 1])
                mean = np.array([P[i, 0], P[i, 1], low[2][0], low[1][0]])
                obs = {og: float(T[i, io])}
                g_mean, half = condition(mean, cal, obs)
                r, c = rows[i]
                b_mean = blend(g_mean, curves, own[r, c], obs, memory_gb=mem[i])
                got = {"gaussian": g_mean,
                       "curves-ratio": curves.predict(own[r, c], obs, "ratio"),
                       "blend-ratio": blend(g_mean, curves, own[r, c], obs, "ratio",
                                            BLEND_RATIO),
                       "curves": curves.predict(own[r, c], obs),
                       "blend-overhead": blend(g_mean, curves, own[r, c], obs),
                       "memory-regression": curves.regress(obs, mem[i]), "blend": b_mean}
                for k, m in got.items():
                    for ih, h in enumerate(VAR_SLICES):
                        if h != og and np.isfinite(T[i, ih]):
                            v = m[ih] if np.isfinite(m[ih]) else g_mean[ih]
                            errs[k][h].append(abs(v - T[i, ih]))
                for ih, h in enumerate(VAR_SLICES):
                    if h != og and np.isfinite(T[i, ih]):
                        ins.append(float(abs(b_mean[ih] - T[i, ih]) <= half[ih] + 1e-12))
            for k in acc:
                alle = [e for h in VAR_SLICES for e in errs[k][h]]
                for h in VAR_SLICES:
                    if errs[k][h]:
                        acc[k]["g"][h].append(np.mean(errs[k][h]))
                if alle:
                    acc[k]["oth"].append(np.mean(alle))
            if ins:
                acc["blend"]["cov"].append(np.mean(ins))
        for k, a in acc.items():
            cells = [f"{np.mean(a['g'][h]):.4f}" if a["g"][h] else "-" for h in VAR_SLICES]
            cov = f"{np.mean(a['cov']):.3f}" if a["cov"] else "-"
            print(f"| {og}g | {k} | " + " | ".join(cells) + f" | {np.mean(a['oth']):.4f} | "
                  f"{cov} |", flush=True)


if __name__ == "__main__":
    main()
