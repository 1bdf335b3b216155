"""Honest evaluation of the MPS-to-MIG predictor against baselines (grouped split, LOWO, timing).

usage: python benchmarks/predictor/evaluate.py [--data NPZ] [--lowo N] [--quick] [--only-lowo]
LOWO holds out, per model family, every mix containing any workload of that family.
Needs the bench extra (scikit-learn). Prints a markdown-ready summary.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time

import numpy as np

from miso.predict.data import (
    DUMMY,
    canonical_order,
    dummy_columns,
    grouped_split,
    identify_workloads,
    load_pairs,
)
from miso.predict.predictor import Predictor, save_ensemble
from miso.predict.train import TrainConfig, train_ensemble

print = functools.partial(print, flush=True)  # noqa: A001


def col_features(mps: np.ndarray) -> np.ndarray:
    """Per job: own profile, mean/min/max of the others, whole-mix sorted profile (context)."""
    own = mps.transpose(0, 2, 1)  # N, 7, 3
    n = own.shape[1]
    tot = own.sum(1, keepdims=True)
    oth = (tot - own) / (n - 1)
    srt = np.take_along_axis(mps, canonical_order(mps)[:, None, :], axis=2).reshape(len(mps), 1, -1)
    return np.concatenate([own, oth, own - oth, np.repeat(srt, n, 1)], -1).reshape(len(mps) * n, -1)


def flat_y(mig: np.ndarray) -> np.ndarray:
    return mig.transpose(0, 2, 1).reshape(-1, 3)


def unflat(p: np.ndarray, n: int) -> np.ndarray:
    return p.reshape(n, 7, 3).transpose(0, 2, 1)


def baselines(tr, va, quick: bool) -> dict[str, np.ndarray]:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import LinearRegression
    from sklearn.neural_network import MLPRegressor

    out = {}
    pos_mean = tr.mig.mean(0)
    out["per-position mean"] = np.broadcast_to(pos_mean, va.mig.shape)
    xtr, ytr, xva = col_features(tr.mps), flat_y(tr.mig), col_features(va.mps)
    own = slice(0, 6)
    lin = LinearRegression().fit(xtr[:, own], ytr)
    out["least squares (own + mean of others)"] = unflat(lin.predict(xva[:, own]), len(va))
    lin2 = LinearRegression().fit(xtr, ytr)
    out["linear regression (own + others + mix context)"] = unflat(lin2.predict(xva), len(va))
    mlp = MLPRegressor(hidden_layer_sizes=(64, 64), max_iter=60 if quick else 200, random_state=0,
                       early_stopping=False, learning_rate_init=3e-3)
    out["MLP 64-64 (same features)"] = unflat(mlp.fit(xtr, ytr).predict(xva), len(va))
    hgb = [HistGradientBoostingRegressor(max_iter=150 if quick else 300, loss="absolute_error",
                                         random_state=0).fit(xtr, ytr[:, k]) for k in range(3)]
    out["gradient-boosted trees (same features)"] = unflat(
        np.stack([h.predict(xva) for h in hgb], 1), len(va))
    return out


def report(name: str, p: np.ndarray, y: np.ndarray, dm: np.ndarray) -> str:
    e = np.abs(p - y)
    rows = e.mean(axis=(0, 2))
    real = e.transpose(0, 2, 1)[~dm].mean()
    return (f"| {name} | {e.mean():.4f} | {real:.4f} | {rows[0]:.4f} | {rows[1]:.4f} | "
            f"{rows[2]:.4f} |")


def unet(tr, cfg: TrainConfig, members: int) -> tuple[Predictor, float]:
    t0 = time.perf_counter()
    cfg = TrainConfig(**{**cfg.as_dict(), "members": members})
    models = train_ensemble(tr, cfg)
    dt = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        save_ensemble(models, tmp, {"config": cfg.as_dict()})
        return Predictor.load(tmp), dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/miso-a100/mps_mig_pairs.npz")
    ap.add_argument("--lowo", type=int, default=8, help="families to hold out (0 = skip)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--members", type=int, default=TrainConfig().members)
    ap.add_argument("--lowo-members", type=int, default=TrainConfig().members)
    ap.add_argument("--only-lowo", action="store_true")
    args = ap.parse_args()
    d = load_pairs(args.data)
    if args.only_lowo:
        lowo(d, TrainConfig(), args.lowo, args.lowo_members)
        return
    tri, vai = grouped_split(d.mix_id, 0.2, 0)
    tr, va = d.subset(tri), d.subset(vai)
    dm = dummy_columns(va.mig)
    va_api = np.where(dm[:, None, :], DUMMY[None, :, None], va.mps)
    cfg = TrainConfig()
    print(f"grouped split: {len(np.unique(tr.mix_id))} train mixes / "
          f"{len(np.unique(va.mix_id))} validation mixes ({len(va)} samples)\n")
    print("| model | MAE all outputs | MAE real jobs | 7g row | 4g row | 3g row |")
    print("|---|---|---|---|---|---|")
    pred, dt = unet(tr, cfg, args.members)
    pm = pred.predict_members(va.mps)
    name = f"U-Net ensemble x{args.members}"
    print(report(f"{name} (measured dummy columns)", pm.mean(0), va.mig, dm))
    print(report(f"{name} (API padding with DUMMY)",
                 pred.predict_mig_normalised(va_api), va.mig, dm))
    print(report("U-Net single member", pm[0], va.mig, dm))
    for name, p in baselines(tr, va, args.quick).items():
        print(report(name, p, va.mig, dm))
    print(f"\nU-Net ensemble train time: {dt:.1f} s for {args.members} members "
          f"({len(np.unique(tr.mix_id))} mixes, {cfg.epochs} epochs)")
    # uncertainty usefulness: correlation of ensemble std with error
    std = pm.std(0)
    err = np.abs(pm.mean(0) - va.mig)
    r = np.corrcoef(std.ravel(), err.ravel())[0, 1]
    hi = std > np.quantile(std, 0.9)
    print(f"ensemble std vs abs error: Pearson r = {r:.3f}; MAE where std in top 10 %: "
          f"{err[hi].mean():.4f} vs rest {err[~hi].mean():.4f}")
    # inference timing (one mix through the public API)
    x = np.random.default_rng(0).uniform(0.2, 1.0, size=(3, 4))
    pred.predict(x)
    n = 500
    t0 = time.perf_counter()
    for _ in range(n):
        pred.predict(x)
    ms = (time.perf_counter() - t0) / n * 1e3
    print(f"inference, one 4-job mix via Predictor.predict: {ms:.3f} ms")

    if args.lowo > 0:
        lowo(d, cfg, args.lowo, args.lowo_members)


def lowo(d, cfg: TrainConfig, n_fam: int, members: int) -> None:
    """Leave one model family out: hold out every mix with any workload of the family."""
    lab, names = identify_workloads(d.mig)
    fam_of = np.array([n.split("_")[0] for n in names[:-1]] + ["DUMMY"])
    fams = list(dict.fromkeys(fam_of[:-1]))[:n_fam]
    print(f"\nleave-one-family-out ({len(fams)} model families; U-Net ensemble x{members}, "
          f"{cfg.epochs} epochs; MAE over the held-out family's columns):\n")
    print("| held-out family | mixes held out | U-Net MAE | GBT MAE | least squares MAE |")
    print("|---|---|---|---|---|")
    tot = {"u": [], "g": [], "l": []}
    labf = np.where(lab >= 0, fam_of[np.maximum(lab, 0)], "?")
    for fam in fams:
        colf = labf == fam
        has = colf.any(1)
        dtr, dte = d.subset(np.flatnonzero(~has)), d.subset(np.flatnonzero(has))
        p1, _ = unet(dtr, cfg, members)
        pu = p1.predict_mig_normalised(dte.mps)
        bl = baselines(dtr, dte, quick=True)
        cm = colf[has][:, None, :].repeat(3, 1)
        eu = np.abs(pu - dte.mig)[cm].mean()
        eg = np.abs(bl["gradient-boosted trees (same features)"] - dte.mig)[cm].mean()
        el = np.abs(bl["least squares (own + mean of others)"] - dte.mig)[cm].mean()
        tot["u"].append(eu)
        tot["g"].append(eg)
        tot["l"].append(el)
        print(f"| {fam} | {len(np.unique(dte.mix_id))} | {eu:.4f} | {eg:.4f} | {el:.4f} |")
    print(f"| **mean** | | {np.mean(tot['u']):.4f} | {np.mean(tot['g']):.4f} | "
          f"{np.mean(tot['l']):.4f} |")


if __name__ == "__main__":
    main()
