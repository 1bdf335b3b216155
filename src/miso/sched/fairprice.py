"""Load-aware fair slices with a stated price (issue 31): how backlogged the cluster is, and
how large a fair slice that backlog lets fairness buy within the price an operator states.
Pure: no I/O.

**Why the load matters.** A protected owner's fair slice is GPU time taken from what packing
would have given the others. When the cluster is not backlogged that time is idle or soon
idle: a fair slice as large as what the owner would get alone on its share (up to a whole GPU)
costs little. When it is backlogged every GPU-second a fair slice takes beyond the job's
packed share is a GPU-second the queue waits for, amplified by the backlog (measured: +16 %
GPU time of the light owner's work became +12-15 % total average JCT at 3.25x the cluster).

**The signal: packing pressure, not the queue.** miso+ absorbs up to ~2x the cluster by
packing (the queue held at most 5 jobs at 1.6x), so the backlog is read as *active jobs per
GPU* (resident plus queued), time-averaged (:class:`Backlog`, an exponential average with a
time constant of ``TAU_S``; the count now when it is larger, so a flood counts at once
and fair slices grow back only as the average falls): 1 job per GPU or fewer is no
backlog (every job could have a whole GPU); more is packing pressure; far more is a queue.

**The price model** (fitted to issue 31's measured frontier, two owners 80/20 on 16
A100-40GB: each compute slice of fair slice above what packing gives cost 5.5-8 % of the total
average JCT at 1.6x and 3.25x the cluster, under 1 % at 0.9x). A job's *packed share* at
pressure ``n`` is ``min(1, PACKED / n)`` of a GPU, the smallest slice at least (miso+
packs ``n`` active jobs per GPU on fewer resident ones: :data:`PACKED`); a fair slice cap
``c`` above it is estimated to cost::

    price(c) = SLOPE x min(1, n - 1) x max(0, c - packed share)

— nothing without backlog (``n <= 1``), all of :data:`SLOPE` once the cluster holds two jobs
per GPU. :func:`fair_cap` picks the largest profile size whose estimated price is within the
stated one; at least the smallest slice (fair share then still orders the queue). With the
stated price 0.05 that is a whole GPU at 0.9x, a 4g slice at 1.6x and a 2g slice at 3.25x of
an A100 (benchmarks/README.md, "Tenancy", measures what they cost).

:class:`FairSlices` keeps, for one cluster's tenancy, the backlog signal, the budget of the
last decision (:meth:`FairSlices.plan`, once per decision; the status shows it) and when
reclaim last returned room on each GPU (reclaim's rate limit,
:mod:`miso.sched.policies.reclaim`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.tenancyconfig import TenancyConfig

#: The fairness price of ``miso simulate`` and ``miso cluster up --fair-share`` when none is
#: stated (5 % of the total average JCT).
DEFAULT_PRICE = 0.05
#: Time constant (s) of the pressure's exponential average (about one typical job's length:
#: a burst of arrivals does not flip the regime, a lasting load does).
TAU_S = 1800.0
#: Active jobs per GPU at or below which the cluster is not backlogged.
NO_BACKLOG = 1.0
#: The total average JCT (as a share) one GPU of fair slice per job above its packed share
#: costs in a backlogged cluster (measured: 5.5-8 % per compute slice of 7; 0.3 leaves a
#: margin).
SLOPE = 0.3
#: A job's packed share is ``PACKED / n`` of a GPU at ``n`` active jobs per GPU.
PACKED = 1.5


class Backlog:
    """Active jobs per GPU, exponentially averaged over time (exact for a piecewise constant
    count between samples)."""

    def __init__(self, tau_s: float = TAU_S) -> None:
        self.tau_s = tau_s
        self.value = 0.0          # the average as of ``t``
        self.t: float | None = None
        self.last = 0.0           # the count per GPU since ``t``
        self.area = 0.0           # the plain time integral of the count (a run's mean)
        self.span = 0.0

    def sample(self, now: float, active: int, gpus: int) -> float:
        """Fold in the count per GPU up to ``now`` and start ``active / gpus`` from it;
        returns the average at ``now``."""
        if self.t is not None and now > self.t:
            dt = now - self.t
            d = math.exp(-dt / self.tau_s)
            self.value = self.last * (1.0 - d) + self.value * d
            self.area += self.last * dt
            self.span += dt
        if self.t is None or now >= self.t:
            self.t = now
        self.last = active / max(1, gpus)
        return self.value

    def mean(self) -> float:
        """The time average of the count per GPU so far (reports)."""
        return self.area / self.span if self.span > 0 else self.last


@dataclass(frozen=True)
class FairBudget:
    """The regime and the fair slice cap one decision call uses."""

    pressure: float       # active jobs per GPU, averaged
    backlogged: bool
    cap: float            # the most of a GPU a fair slice may be
    price_est: float      # the estimated price of that cap
    price: float          # the price the operator stated

    def to_json(self) -> dict[str, object]:
        return {"regime": "backlogged" if self.backlogged else "not backlogged",
                "pressure": self.pressure, "fair_slice_cap": self.cap,
                "price_estimate": self.price_est, "price": self.price}


def packed_share(pressure: float, smallest: float = 0.0) -> float:
    """The part of a GPU packing gives a job at ``pressure`` active jobs per GPU (at least
    ``smallest``, the smallest slice)."""
    return max(smallest, min(1.0, PACKED / max(pressure, 1e-9)))


def estimated_price(cap: float, pressure: float, smallest: float = 0.0) -> float:
    """The price of fair slices of at most ``cap`` of a GPU (module docstring; ``smallest``:
    the smallest slice, which packing gives anyway)."""
    if pressure <= NO_BACKLOG:
        return 0.0
    return SLOPE * min(1.0, pressure - NO_BACKLOG) * max(
        0.0, cap - packed_share(pressure, smallest))


def fair_cap(price: float, pressure: float, sizes: Sequence[float]) -> FairBudget:
    """The largest of ``sizes`` (profile sizes as parts of a GPU, any order) whose
    :func:`estimated_price` is within ``price``; the smallest when none is. Not backlogged:
    the whole GPU."""
    ordered = sorted(sizes)
    if pressure <= NO_BACKLOG:
        return FairBudget(pressure, False, 1.0, 0.0, price)
    cap, est = ordered[0], 0.0
    for c in ordered[1:]:
        e = estimated_price(c, pressure, ordered[0])
        if e <= price + 1e-12:
            cap, est = c, e
    return FairBudget(pressure, True, cap, est, price)


class FairSlices:
    """The fair slices' cap as the load moves, for one cluster's tenancy: the backlog signal,
    the budget of the last decision, and when fair share last returned room on each GPU."""

    def __init__(self, config: TenancyConfig) -> None:
        self.config = config
        #: active jobs per GPU, time-averaged (the fair slices' load signal)
        self.backlog = Backlog()
        #: the regime and fair slice cap of the last decision (None: no price stated)
        self.budget: FairBudget | None = None
        #: GPU -> when fair share last returned room on it (reclaim's rate limit)
        self.reclaimed_at: dict[str, float] = {}

    def cap(self) -> float:
        """The most of a GPU a fair slice may be now: ``demand_per_job`` without a stated
        price, else the cap of the last :meth:`plan`."""
        if self.config.fairness_price is None or self.budget is None:
            return self.config.demand_per_job
        return self.budget.cap

    def plan(self, sizes: Sequence[float]) -> None:
        """With a stated ``fairness_price``: choose the fair slice cap for this decision from
        the backlog (:func:`fair_cap`; ``sizes``: the profile sizes as parts of a GPU; the
        backlog sampled just before) and keep it in :attr:`budget`. Nothing without a price."""
        price = self.config.fairness_price
        if price is None:
            return
        # the backlog now or lately, the larger: a flood counts at once, and fair slices grow
        # back only as the average falls
        self.budget = fair_cap(price, max(self.backlog.value, self.backlog.last), sizes)
