"""How far the one MPS speed model (miso.mps_speed) is from the MISO A100 MPS profiles.

usage: python benchmarks/predictor/mps_speed_fit.py [--data NPZ]

Same measure as the former calibrated contention model's (benchmarks/README.md, "MPS
contention model"): MAE of the normalised MPS profile of the real jobs, one sample per mix,
validation mixes of the grouped split (seed 0). The data set's light padding jobs count as
co-runners. Also the U-Net/per-job predictor's error on profiles the model produces.
"""

from __future__ import annotations

import argparse

import numpy as np

from miso.mps_speed import DEFAULT_PENALTY, PROFILE_LEVELS, measured_profile, sm_fraction_speed
from miso.predict.data import grouped_split, identify_workloads, load_pairs
from miso.sched.estimators import load_predictor
from miso.workloads import catalogue


def profile_mae(path: str) -> tuple[float, list[float], float, int]:
    d = load_pairs(path)
    first = np.unique(d.mix_id, return_index=True)[1]
    d = d.subset(first)
    lab, names = identify_workloads(d.mig)
    dummy = len(names) - 1
    real = lab != dummy
    tr, va = grouped_split(d.mix_id, 0.2, 0)
    rows = []
    for i in va:
        n = lab.shape[1]
        s = np.ones((3, n))
        for col, k in enumerate(lab[i]):
            if k == dummy:
                continue
            for li, lv in enumerate(PROFILE_LEVELS):
                frac = min(lv / 100.0, 1.5 / n) if n > 1 else lv / 100.0
                s[li, col] = sm_fraction_speed(names[k], frac) / (1.0 + DEFAULT_PENALTY * (n - 1))
        rows.append(s)
    s = np.array(rows)
    prof = s.min(axis=1, keepdims=True) / s
    e = np.abs(prof - d.mps[va])
    m = real[va][:, None, :].repeat(3, axis=1)
    per = [float(e[:, k][real[va]].mean()) for k in range(3)]
    mean_prof = d.mps[tr].transpose(0, 2, 1)[real[tr]].mean(0)
    e0 = float(np.abs(d.mps[va].transpose(0, 2, 1)[real[va]] - mean_prof).mean())
    return float(e[m].mean()), per, e0, len(va)


def predictor_mae(mixes: int = 200) -> float:
    """Shipped predictor's mean |error| on 4g/3g speeds from model profiles of random mixes."""
    pred = load_predictor()
    cat = catalogue()
    names = sorted(cat)
    rng = np.random.default_rng(1)
    err = []
    for _ in range(mixes):
        mix = list(rng.choice(names, int(rng.integers(1, 5))))
        out = pred.predict(measured_profile(mix)).by_slices()
        for i, w in enumerate(mix):
            for sl in (4, 3):
                t = cat[w].speed_by_slices.get(sl)
                if t is not None and out[i][sl] is not None:
                    err.append(abs(out[i][sl] - t))
    return float(np.mean(err))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/miso-a100/mps_mig_pairs.npz")
    a = ap.parse_args()
    mae, per, e0, n = profile_mae(a.data)
    print(f"miso.mps_speed vs real MPS profiles ({n} validation mixes): MAE {mae:.4f}, per level "
          f"100/50/14 %: {[round(x, 4) for x in per]}; constant mean profile: {e0:.4f}")
    print(f"shipped predictor on model profiles (200 random mixes): MAE of 4g/3g speeds "
          f"{predictor_mae():.4f}")


if __name__ == "__main__":
    main()
