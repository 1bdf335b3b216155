"""miso+'s choice of a GPU for a queued job: the least crowded GPU that holds it (beside
the pinned residents), unless at light load waiting for a whole GPU ends the jobs sooner.
(Net-gain placement, ``marginal_placement`` / ``min_gain``, measured worse on the saturated
Philly trace and no better elsewhere, was deleted in issue 27; git keeps it.)

A mixin of :class:`~miso.sched.policies.misoplus.MisoPlus` (it reads the policy's knob
``wait_for_gpu``, the flag ``waited`` it sets, and its ``candidate_gpus``/``pinned``/
``speeds``/``heavy_load``/``others_waiting``/``better_to_wait``).
"""

from __future__ import annotations

from typing import Any

from miso.optimize import OptimizerError, optimizer_for
from miso.sched.modelplace import several_models, swap_on_arrival
from miso.sched.policies.base import Scratch, mix_feasible


class GpuChoice:
    """Where a queued job goes (see the module docstring)."""

    wait_for_gpu: bool
    waited: bool
    held: str | None
    _order: dict[str, int]
    candidate_gpus: Any
    pinned: Any
    speeds: Any
    heavy_load: Any
    others_waiting: Any
    better_to_wait: Any
    clock: Any
    batch_jobs: int
    burst_jobs: int
    burst: Any
    landed: Any
    landing_gpu: Any
    batch_restart_frac: float
    in_batch: Any
    restart_cost: Any
    remaining: Any
    max_jobs: int
    model_aware: bool

    def choose_gpu(self, now: float, job: str, sc: Scratch) -> str | None:
        """The least crowded GPU that can hold the job beside its pinned residents (an idle
        one first), skipping a GPU held for a starving job; in a burst its landing GPU. None
        (``waited`` set) when the job should wait: a fixed batch's GPU is full
        (:meth:`batch_full`), or at light load waiting for a whole GPU ends the jobs sooner
        (:meth:`better_to_wait`)."""
        g = None
        for n, cand in self.candidate_gpus(sc, job):
            if cand == self.held:
                continue  # kept for a starving job ahead of this one
            if n == 0 or self.fits_beside_pinned(cand, job, sc):
                g = cand
                break
        if g is not None:
            g = self.landing_gpu(sc, g, job)  # a burst: a free slot, no restart
        if g is not None and self.model_aware and several_models(sc):
            g = swap_on_arrival(self, sc, job, g)  # sched/modelplace.py
        if g is not None and self.batch_full(g, sc):
            self.waited = True
            return None
        if g is not None and self.wait_for_gpu and sc.jobs_on(g) \
                and not self.heavy_load(sc) and not self.others_waiting(sc, job) \
                and self.better_to_wait(g, job, sc):
            self.waited = True
            return None
        return g

    def batch_full(self, g: str, sc: Scratch) -> bool:
        """Whether ``g``, the least crowded GPU, already runs ``batch_jobs`` jobs in a fixed
        mix (:meth:`in_batch`) where a restart costs at least ``batch_restart_frac`` of the
        mean remaining work of ``g``'s jobs: then the job waits for one to end. A whole
        batch side by side on the smallest slices, grown into freed slices by restarts as
        jobs end, has the highest throughput but ends every job late; a few at a time end
        the first ones early and restart less (benchmarks/README.md, "No regret"). Cheap
        restarts make the growth cheap: no cap then (restart 30 s vs 600 s jobs, until
        their remaining work is under 300 s)."""
        cap = self.batch_jobs
        jobs = sc.jobs_on(g)
        if self.burst():  # a burst: the landing layout's slots, no more
            return len(jobs) >= self.burst_jobs
        if cap <= 0 or len(jobs) < cap or not self.in_batch():
            return False
        work = sum(self.remaining(j) for j in jobs) / len(jobs)
        return self.restart_cost("") >= self.batch_restart_frac * work

    def fits_beside_pinned(self, g: str, job: str, sc: Scratch) -> bool:
        """Whether a layout keeps the pinned residents of ``g`` (jobs that cannot checkpoint
        keep their instance, and in a burst the landed ones, :meth:`landed`) and holds
        ``job`` too; a GPU without pinned residents always can
        (:meth:`candidate_gpus` checked the mix). Else the job would wait there for the pinned
        job to end while another GPU could take it."""
        jobs = sc.jobs_on(g)
        gs = sc.state.gpus[g]
        pinned = (self.pinned(sc, jobs) | self.landed(sc, g)) & set(gs.assignment)
        if not pinned:
            return True
        sp = self.speeds(gs.geom, sc, [*jobs, job])
        current = {j: pl for j, pl in gs.assignment.items() if j in sp}
        try:
            optimizer_for(gs.geom).solve(sp, current=current, pinned=pinned)
        except OptimizerError:
            return False
        return True

    def gpu_to_hold(self, sc: Scratch, job: str) -> str | None:
        """The GPU a starving ``job`` (fits nowhere, waited past ``starve_after`` typical
        works) gets: the one where it fits soonest once residents end (the fewest, shortest
        remaining works to wait for, :meth:`room_in`); nobody behind it is placed there until
        it fits, so the GPU drains to room for it instead of filling with smaller jobs that
        pass it. (The GPU with the fewest jobs, held before, could be two 17 GB jobs that
        leave a third no room while they run: the 16-GPU p95, issue 17.)"""
        st = sc.state
        cy = sc.cycle
        best: tuple[float, int, int, str] | None = None
        for g in st.gpus:
            if cy.filters and not cy.allowed(job, g, sc.jobs_on(g)):
                continue
            wait = self.room_in(sc, g, job)
            if wait is None:
                continue
            key = (wait, len(sc.jobs_on(g)), self._order.get(g, 0), g)
            if best is None or key < best:
                best = key
        return None if best is None else best[3]

    def room_in(self, sc: Scratch, g: str, job: str) -> float | None:
        """Work (full-GPU seconds) left to the last resident of ``g`` that must end before
        ``job`` fits beside the others, residents ending in order of their remaining work; 0
        when it fits now, None when it never fits ``g``."""
        st = sc.state
        geom = st.gpus[g].geom
        cap = min(self.max_jobs, geom.model.max_instances)
        left = sorted((self.remaining(j), st.jobs[j].spec.memory_gb) for j in sc.jobs_on(g))
        mem = st.jobs[job].spec.memory_gb
        for k in range(len(left) + 1):
            if len(left) - k < cap and mix_feasible(geom, [m for _, m in left[k:]] + [mem]):
                return left[k - 1][0] if k else 0.0
        return None
