"""A service's request-rate signal and the rate its replicas are planned for.

Pure (no I/O). Per service the planner keeps a rate signal (:class:`RateSignal`: EWMA, last
rate, the recent history) and asks :func:`plan_rate` for the rate to cover:

* **base**: the largest of the smoothed rate (EWMA), the last observed rate and the peak
  observed over the last ``lookback_s`` (bursty services keep their burst capacity);
* **trend**: the least-squares slope of the last ``trend_points`` observations, counted only
  when it stands out of the noise (its t statistic >= ``trend_t``: the slope of a flat, noisy
  rate is no forecast), times the time a new replica needs (its model's load time + one
  window), at most ``max_trend_boost`` of the rate.

The target a covering must reach (:func:`target`) is the base x (1 + headroom), or the
forecast base + trend when that is higher: the headroom is spare capacity that already
absorbs the rise expected while a new replica loads; the trend adds only what exceeds it, so
the service scales out before its SLO is missed without covering the rise twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class RateConfig(Protocol):
    """The knobs the rate signal reads (:class:`~miso.sched.serviceplan.PlannerConfig`)."""

    window_s: float
    ewma_alpha: float
    trend_points: int
    lookback_s: float
    max_trend_boost: float
    trend_t: float


class RateSignal(Protocol):
    """One service's observed rates (req/s): what :func:`record_rate` keeps
    (:class:`~miso.sched.serviceplan.ServiceState` has these fields)."""

    ewma: float
    last: float
    history: list[tuple[float, float]]


@dataclass(frozen=True)
class PlanRate:
    """The rate a service is planned for: ``base`` (req/s), the trend's ``boost`` (req/s,
    0 unless the rise stands out of the noise) and the raw ``slope`` (req/s per s)."""

    base: float
    boost: float
    slope: float

    @property
    def forecast(self) -> float:
        return self.base + self.boost


def record_rate(sig: RateSignal, now: float, rate: float, cfg: RateConfig) -> None:
    """Fold one observation: EWMA, last rate and the history the trend and the lookback peak
    read (kept for ``lookback_s``, at least ``trend_points`` long)."""
    sig.ewma = rate if not sig.history else (
        cfg.ewma_alpha * rate + (1 - cfg.ewma_alpha) * sig.ewma)
    sig.last = rate
    sig.history.append((now, rate))
    while sig.history and now - sig.history[0][0] > cfg.lookback_s and \
            len(sig.history) > cfg.trend_points:
        sig.history.pop(0)


def trend(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(least-squares slope, its t statistic) of (time, rate) points."""
    slope, t_stat = 0.0, 0.0
    if len(points) >= 2:
        tm = sum(t for t, _ in points) / len(points)
        rm = sum(r for _, r in points) / len(points)
        den = sum((t - tm) ** 2 for t, _ in points)
        if den > 0:
            slope = sum((t - tm) * (r - rm) for t, r in points) / den
            resid = sum((r - rm - slope * (t - tm)) ** 2 for t, r in points)
            dof = len(points) - 2
            if dof > 0 and resid > 0:
                t_stat = slope / math.sqrt(resid / dof / den)
            elif slope != 0:
                t_stat = math.copysign(math.inf, slope)
    return slope, t_stat


def plan_rate(sig: RateSignal, load_time_s: float, cfg: RateConfig) -> PlanRate:
    """The rate to plan for (see the module docstring)."""
    slope, t_stat = trend(sig.history[-cfg.trend_points:])
    lead = load_time_s + cfg.window_s
    recent = max((r for t, r in sig.history if t >= sig.history[-1][0] - cfg.lookback_s),
                 default=0.0)
    base = max(sig.ewma, sig.last, recent)
    rising = slope > 0 and t_stat >= cfg.trend_t
    boost = min(slope * lead, cfg.max_trend_boost * max(sig.ewma, sig.last)) if rising else 0.0
    return PlanRate(base, boost, slope)


def target(p: PlanRate, headroom: float) -> float:
    """The rate a covering must reach: base x (1 + headroom), or the forecast when higher."""
    return max(p.base * (1.0 + headroom), p.forecast)
