"""Rebalancing, and its index: idle GPUs in GPU order, crowded GPUs ranked by their best donor.

``miso+`` moves a job onto a GPU that became idle when the time it saves beats a restart. Asking
every crowded GPU for its best donor on every completion costs O(GPUs); a donor's saving only
shrinks while its GPU is unchanged (its remaining work shrinks as it runs), so the GPUs are kept
in a :class:`~miso.sched.ranking.LazyRanking` and re-evaluated only when they change or reach
the top. A GPU counts as changed when the cluster state changes it (:meth:`ClusterState.watch`),
when an event names it or one of its jobs (new speeds, progress, profiles), and when its owner
says so (:meth:`Rebalancing.changed`, e.g. after re-planning it, or when a job's restart cost
is measured).

A restart is priced as everywhere else (:meth:`RestartCosts.cost`): a measured job at its own
cost, fixed while its GPU is unchanged; every other job at one shared price (the mean measured
so far) that moves with every measurement and may fall. So each GPU is ranked twice: by its best
measured donor's key (-saving), and by its best unmeasured donor's gain before the restart (the
shared price is subtracted when popping): neither key can improve while the GPU is unchanged,
whatever the shared price does.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

from miso.sched.events import Event
from miso.sched.modelplace import fill_by_model, move_alone, several_models
from miso.sched.occupancy import Occupancy
from miso.sched.policies.base import Scratch
from miso.sched.ranking import LazyRanking
from miso.sched.state import ClusterState

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.misoplus import MisoPlus

#: (key, job) of a GPU's best donor, or None: (-saving, job) among the jobs whose restart cost
#: was measured, (-gain before the restart, job) among the others (:meth:`Rebalancing.best_donor`).
Donor = tuple[float, str]


class Rebalancing:
    """miso+'s moves onto idle GPUs, after a completion (``pol.rebalancer``, a post-bind
    stage of :class:`~miso.sched.policies.misoplus.MisoPlus`, no options of its own; it reads
    the policy ``pol``'s ``pinned``, ``speeds``, its learners ``work`` and ``restarts`` and
    ``replan``), with its index (the module docstring): each GPU's best donor
    (:meth:`best_donor`, smaller is better) among the jobs whose restart cost was measured or
    among the others may not get better while the GPU is unchanged; the jobs not measured are
    priced at the shared restart price (``restarts.cost("")``)."""

    def __init__(self, pol: MisoPlus) -> None:
        self.pol = pol
        self._sc: Scratch | None = None
        self._round = 0
        self._state: ClusterState | None = None
        self._rankings: tuple[LazyRanking[str], ...] = ()  # (measured donors, the others)
        self._idle: Occupancy[Scratch] = Occupancy(  # (no service replica holds a slice)
            lambda sc, g: None if (gs := sc.state.gpus[g]).busy or gs.base is not None
            or sc.jobs_on(g) else "idle", lambda cls: (cls,))

    def _key(self, measured: bool, g: str) -> tuple[float, str, str] | None:
        sc = self._sc
        assert sc is not None
        got = self.best_donor(sc, g, measured) if g in sc.state.gpus else None
        return None if got is None else (*got, g)

    def changed(self, gpu: str | None) -> None:
        if gpu is not None:
            for r in self._rankings:
                r.changed(gpu)

    def note(self, event: Event, state: ClusterState) -> None:
        """Call with every event (before deciding on it)."""
        self._round += 1
        if state is not self._state:
            self._state = state
            self._rankings = tuple(LazyRanking(partial(self._key, m)) for m in (True, False))
            state.watch(self.changed)
            for g in state.gpus:
                self.changed(g)
        self.changed(getattr(event, "gpu", None))
        job = getattr(event, "job", None)
        if isinstance(job, str) and job in state.jobs:
            self.changed(state.jobs[job].gpu)

    def idle(self, sc: Scratch) -> Iterator[str]:
        """Whole GPUs (no service replica holds a slice of them) with no job and no plan in
        flight, in GPU order. Lazy: the GPUs idle when the iteration starts, whatever is
        placed meanwhile."""
        return self._idle.view(sc).ordered(["idle"])

    def pop(self, sc: Scratch) -> tuple[float, str, str] | None:
        """(-saving, job, gpu) of the best donor on any GPU now, taking that GPU out of the
        ranking until it changes; None when no GPU has a donor. A donor not measured saves
        its gain less the shared price, and is one when that beats the price."""
        if self._sc is not sc:  # first pop of this call
            self._sc = sc
            for g in sc.touched:  # this call's placements: evaluate them as the scratch sees
                self.changed(g)
            # Changes noted from here on (the moves of this call) wait for the next call.
            for r in self._rankings:
                r.refresh(self._round)
        measured, other = (r.peek(self._round) for r in self._rankings)
        got = None if measured is None else measured[0]
        if other is not None:
            c = self.pol.restarts.cost("")  # the shared price, now
            saved = -other[0][0] - c
            if saved > c and (got is None or (-saved, *other[0][1:]) < got):
                got = (-saved, *other[0][1:])
        if got is not None:
            for r in self._rankings:
                r.take(got[2])
        return got


    def best_donor(self, sc: Scratch, g: str, measured: bool) -> Donor | None:
        """(-saving, job) of the job of ``g`` whose restart cost was measured that gains most
        from a whole GPU, when the time it saves (remaining work at its slice's speed vs on
        the whole GPU, less its restart) beats its restart; with ``measured`` false, (-gain,
        job) of the others' best, before the shared price (:meth:`pop`)."""
        gs = sc.state.gpus[g]
        jobs = sc.jobs_on(g)
        if len(jobs) < 2 or gs.busy:
            return None
        pol, costs = self.pol, self.pol.restarts.seen
        # the jobs of this ranking (measured or not) with an instance, pinned ones left out
        cand = [j for j in jobs if (j in costs) == measured and j in gs.assignment]
        pinned = pol.pinned(sc, cand) if cand else ()
        best: Donor | None = None
        for j in cand:
            pl, c = gs.assignment[j], costs.get(j)
            if j in pinned:
                continue
            s = pol.speeds(gs.geom, sc, [j])[j].get(pl.profile, 1.0)
            w = pol.work.remaining(sc.state, j)
            saved = w / max(s, 0.05) - w - (c or 0.0)
            if (c is None or saved > c) and (best is None or (-saved, j) < best):
                best = (-saved, j)
        return best

    def fill_idle_gpus(self, now: float, sc: Scratch) -> None:
        """When nothing queues, move the best donor job (:meth:`best_donor`) of a crowded GPU
        onto each idle GPU, one per donor GPU, best first."""
        if sc.queue(1):
            return
        if self.pol.model_aware and several_models(sc):
            fill_by_model(self.pol, now, sc)  # any job may gain from an idle GPU of another model
            return
        for target in self.idle(sc):
            got = self.pop(sc)
            if got is None:
                return
            saved, j, src = got
            if sc.cycle.filters and not sc.cycle.allowed(j, target, ()):
                continue  # the profile's filters keep this job off that GPU
            move_alone(sc, j, target, f"rebalance to idle {target}", -saved,
                       f"{target} is idle and nothing queues: {j} moves from {src} to the "
                       f"whole GPU, finishing ~{-saved:.0f} s sooner net of one restart")
            self.pol.replan(now, src, sc)
