"""miso+'s restart economy (the permit and reserve stages): what a restart costs over the
time a plan is expected to stand, from each job's remaining work, and the slice kept free for
the next arrival.

:func:`plan_horizon` and :func:`restart_prices` are the economy's arithmetic (a plan is chosen
when its throughput gain beats the sum of these prices); :class:`RestartEconomy` feeds them
from the learners (:mod:`~miso.sched.policies.learners`) and the arrival clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from miso.mig import Placement
from miso.sched.policies.arrivals import ArrivalClock
from miso.sched.policies.base import Scratch
from miso.sched.policies.learners import RestartCosts, WorkLearner
from miso.sched.policies.priors import prior_speeds


def plan_horizon(times: list[float], quantile: float, replans: float, prior_s: float) -> float:
    """How long a plan is expected to stand (s): the ``quantile`` of its jobs' remaining
    ``times`` at current speeds, divided by the ``replans`` expected meanwhile, at least
    ``prior_s``; ``prior_s`` without jobs."""
    ts = sorted(times)
    if not ts:
        return prior_s
    t = ts[min(len(ts) - 1, int(quantile * len(ts)))]
    return max(prior_s, t / max(1.0, replans))


def restart_prices(horizon: float, speeds: Mapping[str, Mapping[str, float]],
                   current: Mapping[str, Placement], cost: Callable[[str], float]
                   ) -> dict[str, float]:
    """Throughput each running job's restart costs over the plan's ``horizon``: the work it
    does not do while it restarts (``cost(job)`` x its speed now) spread over the horizon.
    A plan that moves jobs pays off when its throughput gain beats the sum of their prices."""
    return {j: cost(j) * speeds[j].get(pl.profile, 0.5) / horizon for j, pl in current.items()}


@dataclass(frozen=True)
class EconomyOptions:
    """``on``: restarts priced in plans (miso+'s ``economy``); ``reserve``: headroom kept for
    the next arrival; ``replans``: re-plans of a GPU expected while a plan stands as jobs keep
    arriving (25 measured best, see benchmarks/README.md); ``horizon_quantile`` (0.5: the
    median), and ``batch_horizon_quantile`` in a fixed mix."""

    on: bool = True
    reserve: bool = True
    replans: float = 25.0
    horizon_quantile: float = 0.5
    batch_horizon_quantile: float = 0.75


class RestartEconomy:
    """Pricing of restarts and the headroom kept for the next arrival (:class:`EconomyOptions`;
    ``max_jobs``: the policy's jobs per GPU)."""

    def __init__(self, work: WorkLearner, restarts: RestartCosts, clock: ArrivalClock,
                 opts: EconomyOptions, max_jobs: int) -> None:
        self.work, self.restarts, self.clock = work, restarts, clock
        self.opts, self.max_jobs = opts, max_jobs

    def horizon(self, sc: Scratch, jobs: list[str], speeds: dict[str, dict[str, float]],
                current: dict[str, Placement], in_batch: Callable[[], bool]) -> float:
        """:func:`plan_horizon` of these jobs. While jobs keep arriving the GPU is re-planned
        ``replans`` times meanwhile (every arrival and completion re-plans a GPU), so only
        large gains pay for a restart and free slices are kept for the next arrival; once
        arrivals stop (:meth:`ArrivalClock.quiet`) a plan stands until the GPU's own jobs
        end, so jobs grow into idle slices. In a fixed mix (no arrival at all after the
        batch) the ``batch_horizon_quantile`` (0.75) is used: the layout stands longer, so a
        restart must buy more (measured best, "No regret")."""
        st = sc.state
        ts = []
        for j in jobs:
            pl = current.get(j)
            s = speeds[j].get(pl.profile, 0.5) if pl is not None else 0.5
            ts.append(self.work.remaining(st, j) / max(s, 0.05))
        opts = self.opts
        q = opts.batch_horizon_quantile if in_batch() else opts.horizon_quantile
        k = float(len(ts)) if self.clock.quiet(sc.cycle.now) else opts.replans
        return plan_horizon(ts, q, k, self.restarts.prior_s)

    def prices(self, sc: Scratch, jobs: list[str], speeds: dict[str, dict[str, float]],
               current: dict[str, Placement], in_batch: Callable[[], bool]
               ) -> tuple[float | None, dict[str, float]]:
        """(horizon, :func:`restart_prices`); ``(None, {})`` without ``economy`` or when
        nothing runs."""
        if not (self.opts.on and current):
            return None, {}
        horizon = self.horizon(sc, jobs, speeds, current, in_batch)
        return horizon, restart_prices(horizon, speeds, current, self.restarts.cost)

    def headroom(self, sc: Scratch, g: str, jobs: list[str], heavy_load: Callable[[], bool],
                 first_candidate: Callable[[Scratch, str], Any]) -> dict[str, float] | None:
        """Prior speeds of the next newcomer when one is expected on ``g`` before its jobs'
        median remaining time (arrivals spread over the GPUs, nothing queued): the plan then
        keeps a slice free for it, so its arrival restarts nobody. None otherwise, and at
        light load (``heavy_load()`` false: sharing is not expected)."""
        st = sc.state
        cy = sc.cycle
        if not self.opts.reserve or cy.trigger == "profiled" or self.clock.quiet(cy.now):
            return None
        if not heavy_load():
            return None  # light load: the next newcomer finds an idle GPU or waits for one
        gs = st.gpus[g]
        gap = self.clock.mean_gap()
        if gap is None or len(jobs) + 1 > min(self.max_jobs, gs.geom.model.max_instances):
            return None
        if any(j not in sc.placed for j in st.queue) or sc.requeued:
            return None  # queued jobs take free slices at once
        first = first_candidate(sc, jobs[0])
        if first is None or first[0] < len(jobs):
            return None  # an idle or less crowded GPU takes the next arrival
        ts = sorted(self.work.remaining(st, j) for j in jobs)
        if gap * len(st.gpus) >= ts[len(ts) // 2]:
            return None
        return prior_speeds(gs.geom, self.clock.median_memory()) or None
