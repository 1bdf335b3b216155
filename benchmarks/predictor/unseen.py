"""Predictor on model families it never saw (issue 19): leave-one-family-out (LOWO), all figures.

usage: PYTHONPATH=src python benchmarks/predictor/unseen.py [--data NPZ] [--unet] [--quick]

For each of the 8 MISO model families: every mix holding a workload of the family is held out,
each model is trained on the rest (one sample per mix) and scored on the family's real columns:

* ``mae`` / ``mae_live``: file units (t7, t4, t3 / max); live = padding as the live API pads
  (per-job models never see padding, so both are equal for them);
* ``speed_mae`` 4g / 3g: speeds relative to the full GPU;
* ``coverage_95``: the family's true speeds inside the model's 95 % interval, the interval
  calibrated (split-conformal) on the *other* families' held-out residuals only (nested); the
  U-Net row uses its own +/- 1.96 ensemble std (what it shipped with).

Models fed the same per-job inputs (:func:`miso.predict.perjob.job_features`): the shipped
per-job MLP ensemble, gradient-boosted trees, least squares. ``--unet`` adds the previous shipped
model (U-Net x3, 60 epochs, torch; ~8 x 1-2 min). Then: one measured slice (the job's true 4g
or 3g speed) conditions the other slices (:func:`miso.predict.uncertainty.condition`), and a
grouped split of mixes of known workloads. Needs the bench extra (scikit-learn).
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time

import numpy as np

from miso.predict.data import grouped_split, load_pairs
from miso.predict.evaluation import evaluate
from miso.predict.heldout import (
    clip_speeds,
    column_groups,
    folds,
    lowslice_residuals,
    one_per_mix,
)
from miso.predict.lowslice import fit_lowslice
from miso.predict.perjob import PerJobConfig, fit_perjob, job_features, training_rows
from miso.predict.uncertainty import calibrate, condition, conformal_quantile

print = functools.partial(print, flush=True)  # noqa: A001


def to_file(sp: np.ndarray) -> np.ndarray:
    """(n, 2) speeds -> (n, 3) file units (1, 1/s4, 1/s3) / max."""
    t = np.stack([np.ones(len(sp)), 1 / sp[:, 0], 1 / sp[:, 1]], 1)
    return t / t.max(1, keepdims=True)


def sk_model(kind: str):  # noqa: ANN201
    def fit(mps, mig, real):  # noqa: ANN001, ANN202
        from sklearn.ensemble import HistGradientBoostingRegressor
        from sklearn.linear_model import LinearRegression

        x, y = training_rows(mps, mig, real)
        if kind == "gbt":
            ms = [HistGradientBoostingRegressor(loss="absolute_error", max_iter=200,
                                                random_state=0).fit(x, y[:, k]) for k in (0, 1)]
            return lambda f: np.stack([m.predict(f) for m in ms], 1)
        lin = LinearRegression().fit(x, y)
        return lin.predict
    return fit


def perjob_model(cfg: PerJobConfig):  # noqa: ANN201
    def fit(mps, mig, real):  # noqa: ANN001, ANN202
        m = fit_perjob(mps, mig, real, cfg)
        return lambda f: m.members(f).mean(0)
    return fit


def unet_lowo(dtr, dte, colf):  # noqa: ANN001, ANN201
    """The U-Net (shipped config until issue 19) trained on dtr, scored on dte's colf columns."""
    from miso.predict.predictor import Predictor, save_ensemble
    from miso.predict.train import TrainConfig, train_ensemble

    cfg = TrainConfig()
    models = train_ensemble(dtr, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        save_ensemble(models, tmp, {"config": cfg.as_dict()})
        pred = Predictor.load(tmp)
    res = evaluate(pred, dte, mask=colf)
    real = column_groups(dte.mig)[0] >= 0
    p = pred.live_speeds(dte.mps, real)
    keep = colf[real]
    return res, p.speed[keep][:, 1:3], p.lo[keep][:, 1:3], p.hi[keep][:, 1:3]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/miso-a100/mps_mig_pairs.npz")
    ap.add_argument("--unet", action="store_true", help="also the U-Net (torch, slow)")
    ap.add_argument("--quick", action="store_true", help="per-job model only")
    args = ap.parse_args()
    d = one_per_mix(load_pairs(args.data))
    groups, names = column_groups(d.mig)
    real = groups >= 0
    mg = d.mig.astype(np.float64).transpose(0, 2, 1)
    truth = np.stack([mg[..., 0] / mg[..., 1], mg[..., 0] / mg[..., 2]], -1)  # N, 7, 2
    feats = job_features(d.mps, real)
    cfg = PerJobConfig()
    models = {"per-job MLP x5 (shipped)": perjob_model(cfg)}
    if not args.quick:
        models["gradient-boosted trees (same inputs)"] = sk_model("gbt")
        models["least squares (same inputs)"] = sk_model("lin")
    fold_ids = folds(groups, len(names))
    res: dict[str, dict[str, list]] = {}
    t_all = {k: 0.0 for k in models}
    for f, gs in enumerate(fold_ids):
        colf = np.isin(groups, gs)
        has = colf.any(1)
        for name, fit in models.items():
            c0 = time.process_time()
            predict = fit(d.mps[~has], d.mig[~has], real[~has])
            t_all[name] += time.process_time() - c0
            sp = clip_speeds(predict(feats[has][colf[has]]))
            r = res.setdefault(name, {"pred": [], "true": [], "fold": [], "file": [],
                                      "fam": []})
            r["pred"].append(sp)
            r["true"].append(truth[has][colf[has]])
            r["fold"].append(np.full(len(sp), f))
            r["file"].append(to_file(sp) - mg[has][colf[has]])
            r["fam"].append("/".join(names[g] for g in gs))
        if args.unet:
            c0 = time.process_time()
            ures, sp, lo, hi = unet_lowo(d.subset(np.flatnonzero(~has)),
                                         d.subset(np.flatnonzero(has)), colf[has])
            t_all.setdefault("U-Net x3 (previous shipped, live padding)", 0.0)
            t_all["U-Net x3 (previous shipped, live padding)"] += time.process_time() - c0
            r = res.setdefault("U-Net x3 (previous shipped, live padding)",
                               {"pred": [], "true": [], "fold": [], "lo": [], "hi": [],
                                "mae": [], "mae_live": [], "fam": []})
            r["pred"].append(sp)
            r["true"].append(truth[has][colf[has]])
            r["fold"].append(np.full(len(sp), f))
            r["lo"].append(lo)
            r["hi"].append(hi)
            r["mae"].append(ures["mae"])
            r["mae_live"].append(ures["mae_live"])
            r["fam"].append("/".join(names[g] for g in gs))
        print(f"fold {f} ({'/'.join(names[g] for g in gs)}) done")
    ls = fit_lowslice()
    print("\nLOWO, mean over the 8 held-out families (each family's real columns):\n")
    print("| model | mae | mae_live | speed_mae 4g | speed_mae 3g | coverage_95 | "
          "train CPU s (8 folds) |")
    print("|---|---|---|---|---|---|---|")
    per_fam: dict[str, list[str]] = {}
    for name, r in res.items():
        pred, true, fold = (np.concatenate(r[k]) for k in ("pred", "true", "fold"))
        resid = pred - true
        nf = int(fold.max()) + 1
        m4 = np.mean([np.abs(resid[fold == f, 0]).mean() for f in range(nf)])
        m3 = np.mean([np.abs(resid[fold == f, 1]).mean() for f in range(nf)])
        if "lo" in r:
            lo, hi = np.concatenate(r["lo"]), np.concatenate(r["hi"])
            inside = (true >= lo) & (true <= hi)
            cov = np.mean([inside[fold == f].mean() for f in range(nf)])
            mae = np.mean(r["mae"])
            mae_live = np.mean(r["mae_live"])
        else:
            covs = []
            for f in range(nf):
                other = fold != f
                q = np.array([conformal_quantile(resid[other, k], 0.95) for k in (0, 1)])
                covs.append((np.abs(resid[fold == f]) <= q).mean())
            cov = float(np.mean(covs))
            fe = np.concatenate(r["file"])
            mae = mae_live = np.mean([np.abs(fe[fold == f]).mean() for f in range(nf)])
        print(f"| {name} | {mae:.4f} | {mae_live:.4f} | {m4:.4f} | {m3:.4f} | {cov:.3f} | "
              f"{t_all[name]:.0f} |")
        per_fam[name] = [f"{np.abs(resid[fold == f]).mean():.3f}" for f in range(nf)]
    print("\nspeed_mae (4g and 3g together) per held-out family:\n")
    fams = [n for n in res[next(iter(res))]["fam"]]
    print("| model | " + " | ".join(fams) + " |")
    print("|---|" + "---|" * len(fams))
    for name, row in per_fam.items():
        print(f"| {name} | " + " | ".join(row) + " |")

    # ---- one measured slice conditions the others (per-job model, nested calibration)
    r = res["per-job MLP x5 (shipped)"]
    pred, true, fold = (np.concatenate(r[k]) for k in ("pred", "true", "fold"))
    wl = np.concatenate([np.asarray(x) for x in _workloads(d, groups, fold_ids)])
    low_true = _low_truth(wl)
    print("\nafter one measured slice (per-job model; covariance and half-widths calibrated on "
          "the other families' residuals; speed_mae of the job's other slices among 4g/3g/2g/1g"
          " where the catalogue measured them; mean over families):\n")
    print("| measured slice | 4g | 3g | 2g | 1g | other slices | coverage_95 of the others |")
    print("|---|---|---|---|---|---|---|")
    nf = int(fold.max()) + 1
    for obs_g in (None, 4, 3, 2, 1):
        errs = {g: [] for g in (4, 3, 2, 1)}
        inside_all: list[float] = []
        other_all: list[float] = []
        for f in range(nf):
            o = fold != f
            lo_res = lowslice_residuals(pred[o], wl[o])
            cal = calibrate(pred[o] - true[o], ls.coef, ls.resid_std, 0.95, lo_res)
            ef = {g: [] for g in (4, 3, 2, 1)}
            ins, oth = [], []
            for i in np.flatnonzero(fold == f):
                low = ls.predict(pred[i:i + 1, 0], pred[i:i + 1, 1])
                mean = np.array([pred[i, 0], pred[i, 1], low[2][0], low[1][0]])
                tv = np.array([true[i, 0], true[i, 1], low_true[i, 0], low_true[i, 1]])
                if obs_g is not None and not np.isfinite(tv[(4, 3, 2, 1).index(obs_g)]):
                    continue
                obs = {} if obs_g is None else {obs_g: tv[(4, 3, 2, 1).index(obs_g)]}
                m, h = condition(mean, cal, obs)
                for k, g in enumerate((4, 3, 2, 1)):
                    if g == obs_g or not np.isfinite(tv[k]):
                        continue
                    e = abs(m[k] - tv[k])
                    ef[g].append(e)
                    oth.append(e)
                    ins.append(float(e <= h[k] + 1e-12))
            for g in ef:
                if ef[g]:
                    errs[g].append(np.mean(ef[g]))
            if oth:  # a family none of whose workloads was measured on obs_g: no row
                other_all.append(np.mean(oth))
                inside_all.append(np.mean(ins))
        cells = [f"{np.mean(errs[g]):.4f}" if errs[g] else "-" for g in (4, 3, 2, 1)]
        label = "none (MPS profile only)" if obs_g is None else f"{obs_g}g"
        print(f"| {label} | " + " | ".join(cells) + f" | {np.mean(other_all):.4f} | "
              f"{np.mean(inside_all):.3f} |")

    # ---- mixes of known workloads (grouped split by mix, as before issue 19)
    full = load_pairs(args.data)
    tri, vai = grouped_split(full.mix_id, 0.2, 0)
    tr, va = one_per_mix(full.subset(tri)), full.subset(vai)
    from miso.predict.heldout import train_calibrated
    from miso.predict.predictor import Predictor, save_perjob

    model, meta = train_calibrated(tr, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        save_perjob(model, tmp, meta)
        kn = evaluate(Predictor.load(tmp), va)
    print(f"\nknown workloads, unseen mixes (grouped split 20 % of mixes, seed 0; per-job model "
          f"trained on the other 80 % with its own held-out calibration): {kn}")
    if args.unet:
        from miso.predict.predictor import save_ensemble
        from miso.predict.train import TrainConfig, train_ensemble

        with tempfile.TemporaryDirectory() as tmp:
            save_ensemble(train_ensemble(tr, TrainConfig()), tmp, {})
            ku = evaluate(Predictor.load(tmp), va)
        print(f"same split, U-Net x3 60 epochs (previous shipped config): {ku}")


def _workloads(d, groups, fold_ids):  # noqa: ANN001, ANN202
    """Catalogue workload index of every held-out column, in the order the folds produced."""
    from miso.predict.data import identify_workloads

    lab, _ = identify_workloads(d.mig)
    out = []
    for gs in fold_ids:
        colf = np.isin(groups, gs)
        has = colf.any(1)
        out.append(lab[has][colf[has]])
    return out


def _low_truth(wl: np.ndarray) -> np.ndarray:
    """(n, 2) catalogue 2g/1g speeds of each column's workload (NaN where not measured)."""
    from miso.predict.data import catalogue_mig_columns
    from miso.workloads import catalogue

    names, _ = catalogue_mig_columns()
    cat = catalogue()
    out = np.full((len(wl), 2), np.nan)
    for i, w in enumerate(wl):
        if 0 <= w < len(names) and names[w] in cat:
            sp = dict(cat[names[w]].speed_by_slices)
            out[i] = [sp.get(2, np.nan), sp.get(1, np.nan)]
    return out


if __name__ == "__main__":
    main()
