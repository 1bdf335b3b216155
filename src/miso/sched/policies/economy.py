"""miso+'s restart economy (the permit and reserve stages): what a restart costs over the
time a plan is expected to stand, from each job's remaining work, and the slice kept free for
the next arrival.

:meth:`RestartEconomy.prices` is the economy's arithmetic (a plan is chosen when its
throughput gain beats the sum of these prices), fed by the learners
(:mod:`~miso.sched.policies.learners`) and the arrival clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from miso.mig import Placement
from miso.sched.policies.base import Scratch
from miso.sched.speeds import prior_speeds

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.misoplus import MisoPlus

Speeds = dict[str, dict[str, float]]


@dataclass(frozen=True)
class EconomyOptions:
    """``reserve``: headroom kept for the next arrival;
    ``replans``: re-plans of a GPU expected while a plan stands as jobs keep arriving (25
    measured best, see benchmarks/README.md); ``batch_horizon_quantile``: the quantile of
    the remaining times a plan stands for in a fixed mix (else the median)."""

    reserve: bool = True
    replans: float = 25.0
    batch_horizon_quantile: float = 0.75


class RestartEconomy:
    """Pricing of restarts and the headroom kept for the next arrival (``pol.economy``; its
    options in :class:`EconomyOptions`; it reads the policy ``pol``'s learners ``work`` and
    ``restarts``, its arrival clock ``clock``, ``max_jobs``, ``in_batch``, ``admission`` and
    ``first_candidate``)."""

    def __init__(self, pol: MisoPlus, opts: EconomyOptions) -> None:
        self.pol, self.opts = pol, opts

    def prices(self, sc: Scratch, jobs: list[str], speeds: Speeds,
               current: dict[str, Placement]) -> tuple[float | None, dict[str, float]]:
        """(horizon, price per running job of ``current``); ``(None, {})`` when nothing
        runs.

        The horizon is how long a plan is expected to stand (s): the median of
        its jobs' remaining times at current speeds, divided by the re-plans expected
        meanwhile, at least the configured restart price. While jobs keep arriving the GPU is
        re-planned ``replans`` times meanwhile (every arrival and completion re-plans a GPU),
        so only large gains pay for a restart and free slices are kept for the next arrival;
        once arrivals stop (:meth:`ArrivalClock.quiet`) a plan stands until the GPU's own
        jobs end (one re-plan per job), so jobs grow into idle slices. In a fixed mix (no
        arrival at all after the batch) the ``batch_horizon_quantile`` (0.75) is used: the
        layout stands longer, so a restart must buy more (measured best, "No regret").

        A job's price is the throughput its restart costs over the horizon: the work it does
        not do while it restarts (:meth:`RestartCosts.cost` x its speed now) spread over the
        horizon; a plan that moves jobs pays off when its throughput gain beats the sum of
        their prices. (A running job is one of ``jobs``: the horizon has times to rank.)"""
        pol, opts = self.pol, self.opts
        if not current:
            return None, {}
        # Each job's remaining time at its speed now (0.5 without an instance or a speed on
        # it), sorted.
        ts = sorted(pol.work.remaining(sc.state, j) / max(speeds[j].get(pl.profile, 0.5)
                    if (pl := current.get(j)) is not None else 0.5, 0.05) for j in jobs)
        q = opts.batch_horizon_quantile if pol.in_batch(sc) else 0.5  # (the median)
        k = float(len(ts)) if pol.clock.quiet(sc.cycle.now) else opts.replans
        horizon = max(pol.restarts.prior_s, ts[min(len(ts) - 1, int(q * len(ts)))] / max(1.0, k))
        cost = pol.restarts.cost
        return horizon, {j: cost(j) * speeds[j].get(pl.profile, 0.5) / horizon
                         for j, pl in current.items()}

    def headroom(self, sc: Scratch, g: str, jobs: list[str]) -> dict[str, float] | None:
        """Prior speeds of the next newcomer when one is expected on ``g`` before its jobs'
        median remaining time (arrivals spread over the GPUs, nothing queued): the plan then
        keeps a slice free for it, so its arrival restarts nobody. None otherwise, and at
        light load (:meth:`Admission.heavy_load` false: sharing is not expected)."""
        pol, st, cy = self.pol, sc.state, sc.cycle
        if not self.opts.reserve or cy.trigger == "profiled" or pol.clock.quiet(cy.now):
            return None
        if not pol.admission.heavy_load(sc):
            return None  # light load: the next newcomer finds an idle GPU or waits for one
        gs = st.gpus[g]
        gap = pol.clock.gap
        if gap is None or len(jobs) + 1 > min(pol.max_jobs, gs.geom.model.max_instances):
            return None
        if any(j not in sc.placed for j in st.queue) or sc.requeued:
            return None  # queued jobs take free slices at once
        first = pol.first_candidate(sc, jobs[0])
        if first is None or first[0] < len(jobs):
            return None  # an idle or less crowded GPU takes the next arrival
        ts = sorted(pol.work.remaining(st, j) for j in jobs)
        if gap * len(st.gpus) >= ts[len(ts) // 2]:
            return None
        return prior_speeds(gs.geom, pol.clock.median_memory()) or None
