"""Calibrated intervals and observation-conditioned speeds of one job (pure numpy, no I/O).

Intervals: split-conformal on residuals of models that never saw the residual's model family
(leave-one-family-out), one half-width per slice: the interval ``speed +/- half[g]`` then holds
the true speed of an unseen model's job with the stated probability, as far as the held-out
families are like the next one (benchmarks/README.md measures it).

Observations: the errors of one job's speeds on different slices are strongly correlated (a job
predicted too fast on 4g is too fast on 3g too), so the residuals are treated as jointly
Gaussian with the covariance measured on the same held-out residuals. A measured slice then
moves every other slice by the conditional mean and narrows its interval by the ratio of
conditional to prior standard deviation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

#: Slices whose speeds are random (7g is 1 by definition), in the covariance's order.
VAR_SLICES: tuple[int, ...] = (4, 3, 2, 1)
#: Variance of a measured speed (its noise); keeps conditioning well-posed.
OBS_VAR = 0.005**2


def conformal_quantile(abs_resid: np.ndarray, level: float) -> float:
    """Split-conformal half-width: the ceil((n + 1) level)-th smallest absolute residual."""
    r = np.sort(np.abs(np.asarray(abs_resid, dtype=np.float64)).ravel())
    r = r[np.isfinite(r)]
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if r.size == 0:
        raise ValueError("no residuals to calibrate on")
    k = math.ceil((r.size + 1) * level)
    return float(r[min(k, r.size) - 1]) if k <= r.size else float(r[-1])


@dataclass(frozen=True)
class Calibration:
    """Per-slice half-widths of the ``level`` interval and the residual covariance."""

    level: float
    half: dict[int, float]  # compute slices (4, 3, 2, 1) -> half-width
    cov: np.ndarray  # (4, 4) residual covariance over VAR_SLICES
    n: int = 0  # residuals it was calibrated on

    def as_dict(self) -> dict:
        return {"level": self.level, "half": {str(g): round(v, 6) for g, v in self.half.items()},
                "cov": np.round(self.cov, 8).tolist(), "n": self.n}

    @classmethod
    def from_dict(cls, d: Mapping) -> Calibration:
        cov = np.asarray(d["cov"], dtype=np.float64)
        if cov.shape != (len(VAR_SLICES),) * 2:
            raise ValueError(f"calibration covariance must be 4x4, got {cov.shape}")
        half = {int(g): float(v) for g, v in dict(d["half"]).items()}
        if set(half) != set(VAR_SLICES):
            raise ValueError("calibration half-widths must cover slices 4, 3, 2, 1")
        return cls(float(d["level"]), half, cov, int(d.get("n", 0)))


def lowslice_jacobian(coef: Mapping[int, tuple[float, float, float]]) -> np.ndarray:
    """(4, 2): how the 4/3/2/1g speeds move with the 4g and 3g ones (2g/1g linear model)."""
    return np.array([[1.0, 0.0], [0.0, 1.0], list(coef[2][1:]), list(coef[1][1:])])


def calibrate(resid43: np.ndarray, coef: Mapping[int, tuple[float, float, float]],
              low_resid_std: Mapping[int, float], level: float = 0.95,
              resid21: np.ndarray | None = None) -> Calibration:
    """Calibration from held-out residuals (prediction - truth) of 4g/3g speeds, (n, 2).

    2g/1g: their own held-out residuals (m, 2) where given (NaN where a job does not fit);
    otherwise the 4g/3g half-widths propagated through the linear 2g/1g model plus its residual,
    scaled by how far the empirical 4g/3g quantiles exceed the Gaussian ones.
    """
    r = np.asarray(resid43, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] != 2 or len(r) < 2:
        raise ValueError("resid43 must be (n >= 2, 2)")
    c43 = np.cov(r.T)
    jac = lowslice_jacobian(coef)
    cov = jac @ c43 @ jac.T + np.diag([0.0, 0.0, low_resid_std[2] ** 2, low_resid_std[1] ** 2])
    half = {4: conformal_quantile(r[:, 0], level), 3: conformal_quantile(r[:, 1], level)}
    z = _normal_quantile(0.5 + level / 2)
    infl = float(np.mean([half[4] / (z * math.sqrt(c43[0, 0])),
                          half[3] / (z * math.sqrt(c43[1, 1]))]))
    for i, g in ((0, 2), (1, 1)):
        col = None if resid21 is None else np.asarray(resid21, dtype=np.float64)[:, i]
        if col is not None and np.isfinite(col).sum() >= 20:
            half[g] = conformal_quantile(col, level)
        else:
            half[g] = infl * z * math.sqrt(cov[2 + i, 2 + i])
    return Calibration(level, half, cov, len(r))


def _normal_quantile(p: float) -> float:
    """Inverse standard normal CDF by bisection on erf (no scipy)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def condition(mean: np.ndarray, cal: Calibration, observed: Mapping[int, float]
              ) -> tuple[np.ndarray, np.ndarray]:
    """One job: prior speeds on VAR_SLICES (4,) and measured {slices: speed} -> (mean, half).

    Gaussian conditioning of the residuals on the measured slices; a measured slice gets its
    measurement and half-width 0; others keep their conformal half-width times the ratio of
    conditional to prior standard deviation. Monotonicity (never faster on a smaller slice,
    never above 1) is restored around the measurements.
    """
    mu = np.asarray(mean, dtype=np.float64).copy()
    half = np.array([cal.half[g] for g in VAR_SLICES])
    obs = {g: float(v) for g, v in observed.items() if g in VAR_SLICES}
    if not obs:
        return mu, half
    o = [VAR_SLICES.index(g) for g in obs]
    u = [i for i in range(len(VAR_SLICES)) if i not in o]
    s = cal.cov
    soo = s[np.ix_(o, o)] + OBS_VAR * np.eye(len(o))
    gain = s[np.ix_(u, o)] @ np.linalg.inv(soo)
    v = np.array([min(obs[g], 1.0) for g in obs])
    mu_u = mu[u] + gain @ (v - mu[o])
    var_u = np.diag(s[np.ix_(u, u)] - gain @ s[np.ix_(o, u)])
    prior = np.maximum(np.diag(s)[u], 1e-12)
    out = mu.copy()
    out[u] = mu_u
    out[o] = v
    h = half.copy()
    h[u] = half[u] * np.sqrt(np.clip(var_u, 0.0, None) / prior)
    h[o] = 0.0
    return monotone_fixed(out, np.isin(np.arange(len(out)), o)), h


def monotone_fixed(speed: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """Non-increasing in slice order, <= 1, > 0, without moving ``fixed`` entries."""
    s = np.clip(speed, 0.01, 1.0)
    for i in np.flatnonzero(fixed):
        s[:i] = np.where(fixed[:i], s[:i], np.maximum(s[:i], s[i]))
        s[i + 1:] = np.where(fixed[i + 1:], s[i + 1:], np.minimum(s[i + 1:], s[i]))
    return np.where(fixed, s, np.minimum.accumulate(s))
