"""Calibrate miso.predict.mps_model on the MISO A100 MPS profiles; writes mps_model.json.

usage: python benchmarks/predictor/calibrate_mps.py [--data NPZ] [--write]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from miso.predict import mps_model as mm
from miso.predict.data import grouped_split, identify_workloads, load_pairs

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "src/miso/data/predictor/mps_model.json"
NAMES = ("theta", "gamma", "alpha", "beta", "w_dummy")


def to_params(v: np.ndarray) -> mm.MpsParams:
    sig = 1 / (1 + np.exp(-v))
    return mm.MpsParams(
        theta=0.3 + 0.69 * sig[0],
        gamma=1.0 + 2.0 * sig[1],
        alpha=2.0 * sig[2],
        beta=0.5 * sig[3],
        w_dummy=0.5 * sig[4],
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/miso-a100/mps_mig_pairs.npz")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    d = load_pairs(args.data)
    first = np.unique(d.mix_id, return_index=True)[1]
    d = d.subset(first)
    lab, names = identify_workloads(d.mig)
    dummy = len(names) - 1
    assert (lab >= 0).all()
    real = lab != dummy
    curves_w = np.vstack([mm.curves(names[:-1]), np.zeros((1, 6))])
    c = curves_w[lab]  # M, 7, 6
    n_dummy = (~real).sum(1).astype(float)
    levels = [lv / 100 for lv in mm.MPS_LEVELS]
    tr, va = grouped_split(d.mix_id, 0.2, 0)

    def profile(p: mm.MpsParams, idx: np.ndarray) -> np.ndarray:
        s = mm.contention_speeds(c[idx], levels, p, extra_demand=n_dummy[idx], mask=real[idx])
        s = np.where(real[idx][:, None, :], s, 1.0)
        return s.min(axis=1, keepdims=True) / s

    def mae(p: mm.MpsParams, idx: np.ndarray) -> tuple[float, np.ndarray]:
        e = np.abs(profile(p, idx) - d.mps[idx])
        m = real[idx][:, None, :].repeat(3, axis=1)
        return float(e[m].mean()), np.array([e[:, k][real[idx]].mean() for k in range(3)])

    best = None
    for start in ([0.0] * 5, [1.0, -1.0, 0.0, -2.0, -2.0], [-1.0, 0.0, 1.0, -1.0, -1.0]):
        r = minimize(lambda v: mae(to_params(v), tr)[0], np.array(start), method="Nelder-Mead",
                     options={"maxiter": 1500, "xatol": 1e-4, "fatol": 1e-6})
        if best is None or r.fun < best.fun:
            best = r
    p = to_params(best.x)
    base = mae(mm.MpsParams(), va)
    tr_mae, va_mae = mae(p, tr), mae(p, va)
    # reference: predict each real column by the mean real-column profile of the training mixes
    mean_prof = d.mps[tr].transpose(0, 2, 1)[real[tr]].mean(0)
    e0 = np.abs(d.mps[va].transpose(0, 2, 1)[real[va]] - mean_prof).mean()
    print("params", {k: round(getattr(p, k), 4) for k in NAMES})
    print(f"calibration MAE (normalised MPS profile, real jobs): train {tr_mae[0]:.4f} "
          f"validation {va_mae[0]:.4f} per level {np.round(va_mae[1], 4).tolist()}")
    print(f"uncalibrated defaults: {base[0]:.4f}; constant mean-profile reference: {e0:.4f}")
    if args.write:
        OUT.write_text(json.dumps({
            "params": {k: round(getattr(p, k), 6) for k in NAMES},
            "calibration": {"mixes_train": int(len(tr)), "mixes_validation": int(len(va)),
                            "mae_train": round(tr_mae[0], 5), "mae_validation": round(va_mae[0], 5),
                            "mae_validation_per_level": [round(x, 5) for x in va_mae[1]],
                            "mean_profile_reference_mae": round(float(e0), 5)},
        }, indent=2) + "\n")
        print("wrote", OUT)


if __name__ == "__main__":
    main()
