"""MPS contention model: the MPS profile a mix of catalogue workloads would produce.

For the simulator and the emulated GPU backend, so the real predictor runs on realistic inputs.

Model (a few global parameters, calibrated on the MISO A100 MPS profiles, see
``benchmarks/predictor/calibrate_mps.py`` and ``benchmarks/README.md``):

* job j alone on a fraction x of the GPU runs at f_j(x), the piecewise-linear interpolation of its
  MIG speeds (0 at x=0, s1..s4 at 1/7..4/7, 1 at x=1; 2g/1g speeds missing from the table for
  memory reasons come from the linear 2g/1g model);
* its *width* w_j = f_j^-1(theta): the fraction of the GPU it needs for theta of its full speed;
* at active-thread level p each job occupies u_j = min(p, w_j); the mix demands D = sum u_j;
* job j runs at  f_j(min(1, gamma p)) * max(1, D)^-alpha / (1 + beta (D - u_j)):
  its own cap (MPS gives a little more than the MIG slice of the same SM share: gamma), time
  sharing once the GPU is over-subscribed (alpha) and interference from co-runners' demand (beta).

Speeds are fractions of the job's speed alone on the full GPU (no MPS cap).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from miso.predict.data import DUMMY, MPS_LEVELS

__all__ = ["DUMMY", "MPS_LEVELS", "MpsParams", "mps_speed", "params", "synthesize_mps_speeds"]

_X = np.array([0.0, 1 / 7, 2 / 7, 3 / 7, 4 / 7, 1.0])


@dataclass(frozen=True)
class MpsParams:
    theta: float = 0.85
    gamma: float = 1.2
    alpha: float = 0.8
    beta: float = 0.05
    #: width of the data set's light padding job (only used when calibrating against the data)
    w_dummy: float = 0.05


@cache
def params() -> MpsParams:
    """Calibrated parameters shipped in ``miso/data/predictor/mps_model.json`` (else defaults)."""
    try:
        text = resources.files("miso.data").joinpath("predictor/mps_model.json").read_text()
    except (FileNotFoundError, OSError):
        return MpsParams()
    raw = json.loads(text)
    return MpsParams(**{k: float(v) for k, v in raw["params"].items()})


@cache
def _curve(name: str) -> tuple[float, ...]:
    """Speeds at fractions 0, 1/7, 2/7, 3/7, 4/7, 1 of the GPU (non-decreasing)."""
    from miso.predict.lowslice import fit_lowslice
    from miso.workloads import workload

    sp = workload(name).speed_by_slices
    s4 = sp.get(4, 1.0)
    s3 = sp.get(3, s4)
    low = fit_lowslice().predict(np.array(s4), np.array(s3))
    s2 = sp.get(2, float(low[2]))
    s1 = sp.get(1, float(low[1]))
    v = np.maximum.accumulate(np.array([0.0, s1, s2, s3, s4, 1.0]))
    return tuple(float(x) for x in v)


def curves(names: Sequence[str]) -> np.ndarray:
    """(n, 6) speed curves of catalogue workloads."""
    return np.array([_curve(n) for n in names])


def _interp_rows(x: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Row-wise piecewise-linear f(x) on grid _X; x broadcastable to ys[..., 0]."""
    x = np.clip(x, 0.0, 1.0)
    k = np.clip(np.searchsorted(_X, x, side="right") - 1, 0, len(_X) - 2)
    x0, x1 = _X[k], _X[k + 1]
    y0 = np.take_along_axis(ys, k[..., None], axis=-1)[..., 0]
    y1 = np.take_along_axis(ys, (k + 1)[..., None], axis=-1)[..., 0]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def widths(c: np.ndarray, theta: float) -> np.ndarray:
    """GPU fraction each non-decreasing curve (..., 6) needs for ``theta`` of its full speed."""
    k = np.clip((c < theta).sum(axis=-1) - 1, 0, len(_X) - 2)
    y0 = np.take_along_axis(c, k[..., None], axis=-1)[..., 0]
    y1 = np.take_along_axis(c, (k + 1)[..., None], axis=-1)[..., 0]
    t = np.clip((theta - y0) / np.maximum(y1 - y0, 1e-9), 0.0, 1.0)
    return _X[k] + t * (_X[k + 1] - _X[k])


def contention_speeds(
    c: np.ndarray,
    levels: Sequence[float],
    p: MpsParams,
    extra_demand: float | np.ndarray = 0.0,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Vectorised core: curves (..., n, 6) -> speeds (..., L, n) at level fractions ``levels``.

    ``mask`` (..., n) marks real jobs (padding columns contribute nothing); ``extra_demand`` adds
    demand from jobs not modelled by a curve (the data set's dummy job).
    """
    w = widths(c, p.theta)
    if mask is None:
        mask = np.ones(w.shape, dtype=bool)
    out = []
    for lv in levels:
        u = np.minimum(lv, w) * mask
        d = u.sum(axis=-1, keepdims=True) + np.asarray(extra_demand)[..., None] * np.minimum(
            lv, p.w_dummy
        )
        alone = _interp_rows(np.full(w.shape, min(1.0, p.gamma * lv)), c)
        s = alone * np.maximum(1.0, d) ** (-p.alpha) / (1.0 + p.beta * (d - u))
        out.append(s)
    return np.stack(out, axis=-2)


def synthesize_mps_speeds(
    workload_names: list[str],
    rng: np.random.Generator | None = None,
    noise: float = 0.02,
) -> np.ndarray:
    """Raw relative speeds (3, n) of n co-located catalogue jobs under MPS at 100/50/14 %.

    Each value is the fraction of the job's speed alone on the full GPU. With ``rng`` given,
    multiplicative log-normal noise of relative size ``noise`` is applied (measurement noise);
    without it the result is deterministic. Feed it to :meth:`miso.predict.Predictor.predict`.
    """
    if not workload_names:
        raise ValueError("synthesize_mps_speeds needs at least one workload")
    c = curves(workload_names)
    s = contention_speeds(c, [lv / 100 for lv in MPS_LEVELS], params())
    if rng is not None and noise > 0:
        s = s * np.exp(rng.normal(0.0, noise, size=s.shape))
    return np.clip(s, 1e-4, None)


def mps_speed(workload_name: str, level_pct: float, co_runners: list[str]) -> float:
    """Relative speed of one job at MPS active-thread ``level_pct`` next to ``co_runners``."""
    if not 0 < level_pct <= 100:
        raise ValueError(f"level_pct must be in (0, 100], got {level_pct}")
    c = curves([workload_name, *co_runners])
    return float(contention_speeds(c, [level_pct / 100], params())[0, 0])
