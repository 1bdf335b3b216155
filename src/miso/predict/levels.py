"""Impute missing MPS levels so a 3-level predictor can take a profile measured at fewer levels.

The predictor expects a job's throughput at MPS active-thread levels 100/50/14 %. Each MPS level
is a restart of the job, so profiling fewer levels is cheaper. This module fills the missing
levels from the measured ones with a tiny per-job log-linear model on the rate *ratios*
``q_k = rate_k / rate_100`` (unit-free, so any positive rate unit works):

* ``{100, 14}``: ``log q50 = a * log q14 + c``
* ``{100, 50}``: ``log q14 = a * log q50 + c``
* ``{100}``:     ``log q50 = c50``, ``log q14 = c14`` (the training means)

Imputed log-ratios are clipped to the range seen in training. The coefficients are fitted by
:func:`fit_imputer` on the real-job columns of the released MISO training pairs (see
``benchmarks/predictor/levels.py``, which also measures what each level set costs in accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: The levels a 3-level predictor takes, in its row order.
LEVELS: tuple[int, int, int] = (100, 50, 14)


@dataclass(frozen=True)
class ImputeCoefs:
    """Coefficients of the imputation (natural-log ratios to the 100 % rate)."""

    #: log q50 = a50_from14 * log q14 + c50_from14
    a50_from14: float
    c50_from14: float
    #: log q14 = a14_from50 * log q50 + c14_from50
    a14_from50: float
    c14_from50: float
    #: means of log q50 and log q14 (used when only 100 % is measured)
    c50: float
    c14: float
    #: training range of log q50 and log q14 (imputed values are clipped into it)
    lo50: float
    hi50: float
    lo14: float
    hi14: float


# Fitted by `PYTHONPATH=src python benchmarks/predictor/levels.py --print-constants` on the
# real-job columns of all 2,090 mixes of mps_mig_pairs.npz (one sample per mix): data released
# with MISO (SoCC'22, Baolin Li et al., MIT licence).
FITTED = ImputeCoefs(
    a50_from14=0.292058,
    c50_from14=0.179557,
    a14_from50=2.548175,
    c14_from50=-0.500192,
    c50=0.130860,
    c14=-0.166737,
    lo50=-0.546201,
    hi50=1.148223,
    lo14=-1.822631,
    hi14=2.032558,
)


def fit_imputer(log_q50: np.ndarray, log_q14: np.ndarray) -> ImputeCoefs:
    """Least-squares fit of the imputation from per-job log ratios (one entry per job)."""
    x50 = np.asarray(log_q50, dtype=np.float64).ravel()
    x14 = np.asarray(log_q14, dtype=np.float64).ravel()
    if x50.shape != x14.shape or x50.size < 2:
        raise ValueError("fit_imputer needs two equally long arrays of at least 2 jobs")
    a50, c50f = np.polyfit(x14, x50, 1)
    a14, c14f = np.polyfit(x50, x14, 1)
    return ImputeCoefs(
        a50_from14=float(a50),
        c50_from14=float(c50f),
        a14_from50=float(a14),
        c14_from50=float(c14f),
        c50=float(x50.mean()),
        c14=float(x14.mean()),
        lo50=float(x50.min()),
        hi50=float(x50.max()),
        lo14=float(x14.min()),
        hi14=float(x14.max()),
    )


def impute_log_ratios(
    levels: frozenset[int], log_q50: np.ndarray, log_q14: np.ndarray, coefs: ImputeCoefs
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised core: (log q50, log q14) with the levels not in ``levels`` imputed.

    ``levels`` must contain 100; entries of an array whose level is missing are ignored.
    """
    if 100 not in levels or not levels <= set(LEVELS):
        raise ValueError(f"levels must be a subset of {LEVELS} holding 100, got {sorted(levels)}")
    q50 = np.asarray(log_q50, dtype=np.float64)
    q14 = np.asarray(log_q14, dtype=np.float64)
    has50, has14 = 50 in levels, 14 in levels
    if has50 and has14:
        return q50, q14
    if has14:
        q50 = coefs.a50_from14 * q14 + coefs.c50_from14
    elif has50:
        q14 = coefs.a14_from50 * q50 + coefs.c14_from50
    else:
        q50 = np.full(q50.shape, coefs.c50)
        q14 = np.full(q14.shape, coefs.c14)
    if not has50:
        q50 = np.clip(q50, coefs.lo50, coefs.hi50)
    if not has14:
        q14 = np.clip(q14, coefs.lo14, coefs.hi14)
    return q50, q14


def impute_profile(
    levels: tuple[int, ...], rates: Sequence[float], coefs: ImputeCoefs = FITTED
) -> tuple[float, float, float]:
    """One job's rates at (100, 50, 14) % from its rates at ``levels`` (any order, must hold 100).

    Measured levels pass through unchanged; missing ones are imputed (same unit as ``rates``).
    Raises ValueError on an unknown or repeated level, a length mismatch, or a rate that is not
    a finite positive number.
    """
    lv = tuple(levels)
    rs = tuple(rates)
    if len(lv) != len(rs):
        raise ValueError(f"{len(lv)} levels but {len(rs)} rates")
    for level in lv:
        if isinstance(level, bool) or not isinstance(level, int | np.integer):
            raise ValueError(f"level {level!r} is not an integer percentage")
        if level not in LEVELS:
            raise ValueError(f"unknown MPS level {level} (known: {', '.join(map(str, LEVELS))})")
    if len(set(lv)) != len(lv):
        raise ValueError(f"repeated MPS level in {lv}")
    if 100 not in lv:
        raise ValueError("the 100 % level must be measured")
    for r in rs:
        if isinstance(r, bool) or not isinstance(r, int | float | np.floating | np.integer):
            raise ValueError(f"rate {r!r} is not a number")
        if not math.isfinite(r) or r <= 0:
            raise ValueError(f"rates must be finite and positive, got {r}")
    by = dict(zip(lv, (float(r) for r in rs), strict=True))
    r100 = by[100]
    l50 = math.log(by[50] / r100) if 50 in by else 0.0
    l14 = math.log(by[14] / r100) if 14 in by else 0.0
    q50, q14 = impute_log_ratios(frozenset(lv), np.array(l50), np.array(l14), coefs)
    r50 = by[50] if 50 in by else r100 * math.exp(float(q50))
    r14 = by[14] if 14 in by else r100 * math.exp(float(q14))
    return (r100, r50, r14)
