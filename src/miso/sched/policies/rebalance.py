"""Rebalance index: idle GPUs in GPU order, and crowded GPUs ranked by their best donor job.

``miso+`` moves a job onto a GPU that became idle when the time it saves beats a restart. Asking
every crowded GPU for its best donor on every completion costs O(GPUs); a donor's saving only
shrinks while its GPU is unchanged (its remaining work shrinks as it runs), so the GPUs are kept
in a :class:`~miso.sched.ranking.LazyRanking` and re-evaluated only when they change or reach
the top. A GPU counts as changed when the cluster state changes it (:meth:`ClusterState.watch`),
when an event names it or one of its jobs (new speeds, progress, profiles), and when its owner
says so (:meth:`RebalanceIndex.changed`, e.g. after re-planning it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from miso.sched.events import Event
from miso.sched.modelplace import fill_by_model, move_alone, several_models
from miso.sched.occupancy import Occupancy
from miso.sched.policies.base import Scratch
from miso.sched.ranking import LazyRanking
from miso.sched.state import ClusterState

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.misoplus import MisoPlus

#: (-saving, job) of a GPU's best donor, or None: the key of :class:`RebalanceIndex`.
Donor = tuple[float, str]


class RebalanceIndex:
    """``best(sc, gpu)`` gives a GPU's best donor (smaller is better) or None; it must never
    get better while the GPU is unchanged."""

    def __init__(self, best: Callable[[Scratch, str], Donor | None]) -> None:
        self.best = best
        self._sc: Scratch | None = None
        self._round = 0
        self._state: ClusterState | None = None
        self._ranking: LazyRanking[str] = LazyRanking(self._key)
        self._idle: Occupancy[Scratch] = Occupancy(
            lambda sc, g: None if sc.state.gpus[g].busy or sc.jobs_on(g) else "idle",
            lambda cls: (cls,))

    def _key(self, g: str) -> tuple[float, str, str] | None:
        sc = self._sc
        assert sc is not None
        if g not in sc.state.gpus:
            return None
        got = self.best(sc, g)
        return None if got is None else (got[0], got[1], g)

    def changed(self, gpu: str | None) -> None:
        if gpu is not None:
            self._ranking.changed(gpu)

    def note(self, event: Event, state: ClusterState) -> None:
        """Call with every event (before deciding on it)."""
        self._round += 1
        if state is not self._state:
            self._state = state
            self._ranking = LazyRanking(self._key)
            state.watch(self._ranking.changed)
            for g in state.gpus:
                self._ranking.changed(g)
        self.changed(getattr(event, "gpu", None))
        job = getattr(event, "job", None)
        if isinstance(job, str) and job in state.jobs:
            self.changed(state.jobs[job].gpu)

    def idle(self, sc: Scratch) -> Iterator[str]:
        """GPUs with no job and no plan in flight, in GPU order. Lazy: the GPUs idle when the
        iteration starts, whatever is placed meanwhile."""
        return self._idle.view(sc).ordered(["idle"])

    def pop(self, sc: Scratch) -> tuple[float, str, str] | None:
        """(-saving, job, gpu) of the best donor on any GPU now, taking that GPU out of the
        ranking until it changes; None when no GPU has a donor."""
        if self._sc is not sc:  # first pop of this call
            self._sc = sc
            for g in sc.touched:  # this call's placements: evaluate them as the scratch sees
                self._ranking.changed(g)
            # Changes noted from here on (the moves of this call) wait for the next call.
            self._ranking.refresh(self._round)
        got = self._ranking.pop(self._round)
        return None if got is None else got[0]


class Rebalancing:
    """miso+'s moves onto idle GPUs, after a completion (``pol.rebalancer``, a post-bind
    stage of :class:`~miso.sched.policies.misoplus.MisoPlus`, no options of its own; it reads
    the policy ``pol``'s ``donors``, ``pinned``, ``speeds``, its learners ``work`` and
    ``restarts`` and ``replan``)."""

    def __init__(self, pol: MisoPlus) -> None:
        self.pol = pol

    def best_donor(self, sc: Scratch, g: str) -> Donor | None:
        """(-saving, job) of the job of ``g`` that gains most from a whole GPU, when the time
        it saves (remaining work at its slice's speed vs on the whole GPU) beats a restart."""
        gs = sc.state.gpus[g]
        jobs = sc.jobs_on(g)
        if len(jobs) < 2 or gs.busy:
            return None
        pol = self.pol
        pinned = pol.pinned(sc, jobs)
        restart_s = pol.restarts.prior_s
        best: Donor | None = None
        for j in jobs:
            pl = gs.assignment.get(j)
            if pl is None or j in pinned:
                continue
            s = pol.speeds(gs.geom, sc, [j])[j].get(pl.profile, 1.0)
            w = pol.work.remaining(sc.state, j)
            saved = w / max(s, 0.05) - (w + restart_s)
            if saved > restart_s and (best is None or (-saved, j) < best):
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
        for target in self.pol.donors.idle(sc):
            if sc.state.gpus[target].base is not None:
                continue  # service replicas hold slices of it: not a whole idle GPU
            got = self.pol.donors.pop(sc)
            if got is None:
                return
            saved, j, src = got
            if sc.cycle.filters and not sc.cycle.allowed(j, target, ()):
                continue  # the profile's filters keep this job off that GPU
            move_alone(sc, j, target, f"rebalance to idle {target}", -saved,
                       f"{target} is idle and nothing queues: {j} moves from {src} to the "
                       f"whole GPU, finishing ~{-saved:.0f} s sooner net of one restart")
            self.pol.replan(now, src, sc)
