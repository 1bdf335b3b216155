"""How much predictor accuracy do fewer MPS levels cost? (issue 8, "fewer MPS levels")

usage: PYTHONPATH=src python benchmarks/predictor/levels.py [--data NPZ] [--folds 4] [--seed 0]
                                                           [--epochs 60] [--print-constants]

Grouped split by model family (as evaluate.py's leave-family-out): the 8 families are dealt into
``--folds`` folds; for each fold every mix holding any workload of the fold's families is a test
mix, the rest train, and errors count only the held-out families' columns, so no measured
workload is ever in training. Every workload is tested once; errors are pooled over the folds.

Per fold: a U-Net (shipped configuration, 1 member) is retrained on the training mixes and fed
(a) all 3 measured levels, (b) 100 + 14 with 50 imputed, (b') 100 + 50 with 14 imputed, (c) 100
alone with both imputed; the imputation (:mod:`miso.predict.levels`) is fitted on the training
mixes only. (d) per-job gradient-boosted trees trained on each level set. The live system pads
mixes with the DUMMY profile, so every model sees that padding; only real jobs are scored.
Needs the bench extra (scikit-learn). Deterministic; ~2-3 min on one core.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
import warnings
from dataclasses import asdict

import numpy as np

from miso.predict.data import DUMMY, PairData, dummy_columns, identify_workloads, load_pairs
from miso.predict.levels import ImputeCoefs, fit_imputer, impute_log_ratios
from miso.predict.lowslice import fit_lowslice
from miso.predict.predictor import Predictor
from miso.predict.train import TrainConfig, predict_models, train_ensemble
from miso.workloads import catalogue

print = functools.partial(print, flush=True)  # noqa: A001

ALL = (100, 50, 14)
ROW = {100: 0, 50: 1, 14: 2}
GBT_SETS: tuple[tuple[int, ...], ...] = ((100,), (100, 14), (100, 50), (50, 14), (100, 50, 14))
UNET_SETS: tuple[tuple[int, ...], ...] = ((100, 50, 14), (100, 14), (100, 50), (100,))


def log_ratios(mps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column log(rate50/rate100), log(rate14/rate100) from data-convention times."""
    return np.log(mps[:, 0] / mps[:, 1]), np.log(mps[:, 0] / mps[:, 2])


def imputed_input(mps: np.ndarray, real: np.ndarray, levels: tuple[int, ...],
                  coefs: ImputeCoefs) -> np.ndarray:
    """(N, 3, 7) data-convention input with the levels not in ``levels`` imputed on real jobs."""
    l50, l14 = log_ratios(mps)
    q50, q14 = impute_log_ratios(frozenset(levels), l50, l14, coefs)
    rates = np.stack([np.ones_like(q50), np.exp(q50), np.exp(q14)], axis=1)  # N, 3, 7
    x = (rates.min(axis=1, keepdims=True) / rates).astype(np.float32)
    return np.where(real[:, None, :], x, DUMMY[None, :, None])


def gbt_features(mps: np.ndarray, real: np.ndarray, levels: tuple[int, ...]) -> np.ndarray:
    """Per real column: own profile at ``levels`` (renormalised over them), mean/min/max of the
    mix's other real jobs (NaN when alone) and the number of real jobs: (n_real_cols, F)."""
    x = mps[:, [ROW[k] for k in levels], :].astype(np.float64)
    x = x / x.max(axis=1, keepdims=True)  # what a profile at only these levels normalises to
    own = x.transpose(0, 2, 1)  # N, 7, L
    w = real[:, :, None].astype(np.float64)
    n = real.sum(1)[:, None, None].astype(np.float64)
    oth_n = n - w
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = ((own * w).sum(1, keepdims=True) - own * w) / oth_n
    big = np.where(w > 0, own, np.nan)
    feats = [own, mean]
    for red in (np.nanmin, np.nanmax):
        cols = []
        for j in range(own.shape[1]):
            others = np.delete(big, j, axis=1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: a job alone
                cols.append(red(others, axis=1))
        feats.append(np.stack(cols, 1))
    feats.append(np.broadcast_to(n, (*own.shape[:2], 1)))
    f = np.concatenate(feats, -1)
    f[~np.isfinite(f)] = np.nan
    return f[real]


def speeds(y: np.ndarray) -> np.ndarray:
    """(M, 3) data-convention rows t7,t4,t3 -> (M, 4) speed on 4g, 3g, 2g, 1g vs the full GPU."""
    s4, s3 = y[:, 0] / y[:, 1], y[:, 0] / y[:, 2]
    low = fit_lowslice().predict(s4, s3)
    return np.stack([s4, s3, low[2], low[1]], axis=1)


class Scores:
    """Pooled absolute errors per (level set, model) over all folds."""

    def __init__(self) -> None:
        self.time: dict[tuple[str, str], list[np.ndarray]] = {}
        self.speed: dict[tuple[str, str], list[np.ndarray]] = {}

    def add(self, key: tuple[str, str], pred: np.ndarray, y: np.ndarray, s_true: np.ndarray
            ) -> None:
        """pred, y: (M, 3) data-convention rows of the scored columns; s_true: (M, 4) speeds."""
        self.time.setdefault(key, []).append(np.abs(pred - y))
        self.speed.setdefault(key, []).append(np.abs(speeds(pred) - s_true))

    def row(self, key: tuple[str, str]) -> tuple[np.ndarray, float, np.ndarray, float]:
        t = np.concatenate(self.time[key])
        s = np.concatenate(self.speed[key])
        st = np.nanmean(s, axis=0)
        return t.mean(0), float(t.mean()), st, float(np.nanmean(s))


def name(levels: tuple[int, ...]) -> str:
    return "+".join(str(k) for k in levels)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/miso-a100/mps_mig_pairs.npz")
    ap.add_argument("--folds", type=int, default=4, help="family folds (2..8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=TrainConfig().epochs)
    ap.add_argument("--gbt-iter", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--print-constants", action="store_true",
                    help="print the imputation fitted on all mixes as Python (for levels.py)")
    args = ap.parse_args()
    os.environ["MISO_TRAIN_THREADS"] = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from sklearn.ensemble import HistGradientBoostingRegressor

    t_start = time.perf_counter()
    d = load_pairs(args.data)
    d = d.subset(np.unique(d.mix_id, return_index=True)[1])  # one sample per mix
    real = ~dummy_columns(d.mig)
    lab, names = identify_workloads(d.mig)
    fam_names = np.array([n.split("_")[0] for n in names[:-1]] + ["DUMMY"])
    fam = fam_names[lab]
    cat = catalogue()
    truth_low = np.array([[cat[n].speed_by_slices.get(g, np.nan) if n in cat else np.nan
                           for g in (2, 1)] for n in names])  # per label: 2g, 1g speed
    mps_api = np.where(real[:, None, :], d.mps, DUMMY[None, :, None]).astype(np.float32)

    l50_all, l14_all = log_ratios(d.mps)
    full = fit_imputer(l50_all[real], l14_all[real])
    if args.print_constants:
        print("FITTED = ImputeCoefs(")
        for k, v in asdict(full).items():
            print(f"    {k}={v:.6f},")
        print(")")
        return

    families = sorted(set(fam_names[:-1]))
    order = np.random.default_rng(args.seed).permutation(len(families))
    folds = [[families[i] for i in order[f::args.folds]] for f in range(args.folds)]
    cfg = TrainConfig(epochs=args.epochs, members=1, seed=args.seed)
    shipped = Predictor.load()
    sc = Scores()
    imp_err: list[np.ndarray] = []
    print(f"{len(d)} mixes, {int(real.sum())} real job columns; folds by family: "
          + "; ".join(",".join(f) for f in folds))
    print("\nimputation coefficients per fold (log ratios to the 100 % rate):")
    for fold in folds:
        colf = np.isin(fam, fold) & real
        has = colf.any(1)
        tr, te = np.flatnonzero(~has), np.flatnonzero(has)
        m = colf[te]  # scored columns of the test mixes
        y = d.mig[te].transpose(0, 2, 1)[m]  # M, 3
        s_true = np.concatenate([speeds(y)[:, :2], truth_low[lab[te][m]]], axis=1)
        coefs = fit_imputer(l50_all[tr][real[tr]], l14_all[tr][real[tr]])
        print(f"  held out {','.join(fold)} ({len(te)} test / {len(tr)} train mixes): "
              f"log q50 = {coefs.a50_from14:.3f} log q14 + {coefs.c50_from14:.3f}; "
              f"log q14 = {coefs.a14_from50:.3f} log q50 + {coefs.c14_from50:.3f}; "
              f"100 only: q50 = {np.exp(coefs.c50):.3f}, q14 = {np.exp(coefs.c14):.3f}")
        q50_imp, _ = impute_log_ratios(frozenset((100, 14)), l50_all[te], l14_all[te], coefs)
        imp_err.append(np.abs(np.exp(q50_imp - l50_all[te]) - 1.0)[m])
        t0 = time.perf_counter()
        dtr = PairData(mps_api[tr], d.mig[tr], d.mix_id[tr])
        net = train_ensemble(dtr, cfg)
        t_train = time.perf_counter() - t0
        for levels in UNET_SETS:
            x = imputed_input(mps_api[te], real[te], levels, coefs)
            p = predict_models(net, x)[0].transpose(0, 2, 1)[m]
            sc.add((name(levels), "U-Net (retrained)"), p, y, s_true)
            ps = shipped.predict_members(x, real[te]).mean(0).transpose(0, 2, 1)[m]
            sc.add((name(levels), f"shipped model ({shipped.kind})*"), ps, y, s_true)
        t0 = time.perf_counter()
        ytr = d.mig[tr].transpose(0, 2, 1)[real[tr]]
        for levels in GBT_SETS:
            ftr = gbt_features(mps_api[tr], real[tr], levels)
            fte = gbt_features(mps_api[te], real[te], levels)
            sel = m[real[te]]  # scored among the test mixes' real columns
            p = np.stack([
                HistGradientBoostingRegressor(max_iter=args.gbt_iter, loss="absolute_error",
                                              random_state=args.seed).fit(ftr, ytr[:, k])
                .predict(fte)[sel] for k in range(3)], axis=1)
            sc.add((name(levels), "gradient boosting"), p, y, s_true)
        t_gbt = time.perf_counter() - t0
        print(f"    U-Net training {t_train:.1f} s, gradient boosting {t_gbt:.1f} s")

    ref_key = (name(ALL), "U-Net (retrained)")
    _, ref_t, _, ref_s = sc.row(ref_key)
    print(f"\nleave-family-out, {args.folds} folds, {sum(len(e) for e in imp_err)} held-out real "
          "job columns; MAE of the predicted normalised MIG times (rows 7g/4g/3g, the U-Net's "
          "outputs) and of the speed vs the full GPU on 4g/3g (t7/tg) and 2g/1g (linear model; "
          "truth: A100 table); ratio = MAE / 3-level U-Net's\n")
    print("| levels | model | 7g row | 4g row | 3g row | all rows | ratio | speed 4g | 3g | 2g | "
          "1g | speed all | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted(sc.time, key=lambda k: (-len(k[0].split("+")), k[0] != name(ALL), k[1]))
    for key in keys:
        rows, t_all, srows, s_all = sc.row(key)
        print(f"| {key[0]} | {key[1]} | " + " | ".join(f"{v:.4f}" for v in rows)
              + f" | {t_all:.4f} | {t_all / ref_t:.2f} | "
              + " | ".join(f"{v:.4f}" for v in srows) + f" | {s_all:.4f} | {s_all / ref_s:.2f} |")
    print("\n* the shipped weights were trained on every mix, the test mixes included: "
          "not a generalisation figure (shown because the live system runs them)")
    e = np.concatenate(imp_err)
    print(f"\n50 % rate imputed from 100 + 14 (held-out folds): |imputed/measured - 1| median "
          f"{np.median(e):.3f}, p90 {np.quantile(e, 0.9):.3f}, p99 {np.quantile(e, 0.99):.3f}, "
          f"max {e.max():.3f}")
    print("imputation fitted on all mixes (the constants of miso.predict.levels): "
          + ", ".join(f"{k}={v:.4f}" for k, v in asdict(full).items()))
    print(f"total {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
