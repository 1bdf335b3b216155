"""Linear model for the 2g and 1g speeds from the 7g/4g/3g ones (MISO paper: R^2 = 0.96).

Speeds are relative to the full GPU, so the 7g speed is 1 by definition and the features are the
4g and 3g speeds plus an intercept. It is fitted by least squares on the shipped A100 table
(``mig_speed_a100_40gb.csv``) over the workloads measured on the target slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np


@dataclass(frozen=True)
class LowSliceModel:
    """speed_g = coef[g] . (1, s4, s3) for g in (2, 1); residual std per slice."""

    coef: dict[int, tuple[float, float, float]]
    resid_std: dict[int, float]
    r2: dict[int, float]
    mae: dict[int, float]
    r2_loo: dict[int, float]
    mae_loo: dict[int, float]
    n: dict[int, int]

    def predict(self, s4: np.ndarray, s3: np.ndarray) -> dict[int, np.ndarray]:
        """2g and 1g speeds, clipped to (0.01, speed on the next larger slice]."""
        s4 = np.asarray(s4, dtype=np.float64)
        s3 = np.asarray(s3, dtype=np.float64)
        out: dict[int, np.ndarray] = {}
        upper = s3
        for g in (2, 1):
            c = self.coef[g]
            v = c[0] + c[1] * s4 + c[2] * s3
            v = np.clip(v, 0.01, np.maximum(upper, 0.01))
            out[g] = v
            upper = v
        return out


def _table() -> dict[str, dict[int, float]]:
    from miso.workloads import catalogue

    return {w.name: dict(w.speed_by_slices) for w in catalogue().values()}


@cache
def fit_lowslice() -> LowSliceModel:
    """Fit on the shipped table; also report leave-one-workload-out R^2 / MAE."""
    table = _table()
    coef, resid, r2, mae, r2_loo, mae_loo, n = {}, {}, {}, {}, {}, {}, {}
    for g in (2, 1):
        rows = [s for s in table.values() if all(k in s for k in (4, 3, g))]
        x = np.array([[1.0, s[4], s[3]] for s in rows])
        y = np.array([s[g] for s in rows])
        w, *_ = np.linalg.lstsq(x, y, rcond=None)
        pred = x @ w
        ss_tot = float(((y - y.mean()) ** 2).sum())
        loo = np.empty_like(y)
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            wi, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
            loo[i] = x[i] @ wi
        coef[g] = tuple(float(v) for v in w)
        resid[g] = float(np.sqrt(((y - pred) ** 2).sum() / max(1, len(y) - 3)))
        r2[g] = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot
        mae[g] = float(np.abs(y - pred).mean())
        r2_loo[g] = 1.0 - float(((y - loo) ** 2).sum()) / ss_tot
        mae_loo[g] = float(np.abs(y - loo).mean())
        n[g] = len(y)
    return LowSliceModel(coef, resid, r2, mae, r2_loo, mae_loo, n)
