"""miso+'s choice of a GPU for a queued job: the least crowded GPU that holds it (beside
the pinned residents), unless at light load waiting for a whole GPU ends the jobs sooner.
(Net-gain placement, ``marginal_placement`` / ``min_gain``, measured worse on the saturated
Philly trace and no better elsewhere, was deleted in issue 27; git keeps it.)

The filter/score stage of :class:`~miso.sched.policies.misoplus.MisoPlus` (``pol.choice``;
its own options in :class:`ChoiceOptions`; it reads the policy ``pol``'s ``candidate_gpus``,
``pinned``, ``speeds`` and ``in_batch``, and asks its permit stage ``admission``; the facts of
one pass over the queue come as arguments, not fields on the policy).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from miso.optimfeasible import feasibility_for
from miso.sched.freeslots import most_jobs_beside
from miso.sched.modelplace import several_models, swap_on_arrival
from miso.sched.policies.base import Scratch, fitting_profiles, mix_feasible

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.misoplus import MisoPlus


@dataclass(frozen=True)
class ChoiceOptions:
    """``wait_for_gpu``: at light load a newcomer may wait for a whole GPU
    (:meth:`Admission.better_to_wait`); ``batch_jobs``: the cap of a fixed mix
    (:meth:`GpuChoice.batch_full`, with the burst regime's ``batch_restart_frac``)."""

    wait_for_gpu: bool = True
    batch_jobs: int = 4


class GpuChoice:
    """Where a queued job goes (see the module docstring)."""

    def __init__(self, pol: MisoPlus, opts: ChoiceOptions) -> None:
        self.pol = pol
        self.opts = opts

    def choose_gpu(self, job: str, sc: Scratch, ahead: int, held: str | None
                   ) -> tuple[str | None, bool]:
        """(GPU, False): the least crowded GPU that can hold the job beside its pinned
        residents (an idle one first), skipping ``held`` (the GPU held for a starving job);
        in a burst its landing GPU. (None, False) when no GPU can; (None, True) when the job
        should wait: a fixed batch's GPU is full (:meth:`batch_full`), or at light load
        waiting for a whole GPU ends the jobs sooner (:meth:`better_to_wait`; ``ahead``:
        queued jobs ahead of it in this pass)."""
        g = next(self.fitting(sc, job, held), None)
        if g is None:
            return None, False
        g = self.pol.bursts.landing_gpu(sc, g, job, held)  # a burst: a free slot, no restart
        if self.pol.model_aware and several_models(sc):
            g = swap_on_arrival(self.pol, sc, job, g, held)  # sched/modelplace.py
        if self.batch_full(g, sc):
            return None, True
        adm = self.pol.admission
        if self.opts.wait_for_gpu and sc.jobs_on(g) \
                and not adm.heavy_load(sc) and not adm.others_waiting(sc, job) \
                and adm.better_to_wait(g, job, sc, ahead):
            return None, True
        return g, False

    def fitting(self, sc: Scratch, job: str, held: str | None = None) -> Iterator[str]:
        """The GPUs that hold ``job`` beside their pinned residents (:meth:`fits_beside_pinned`),
        least crowded first, but ``held`` (kept for a starving job ahead of it); lazy: the
        placement and fair share's room test (:meth:`MisoPlus.has_room`) take the first."""
        return (g for n, g in self.pol.candidate_gpus(sc, job)
                if g != held and (n == 0 or self.fits_beside_pinned(g, job, sc)))

    def batch_full(self, g: str, sc: Scratch) -> bool:
        """Whether ``g``, the least crowded GPU, already runs ``batch_jobs`` jobs in a fixed
        mix (:meth:`in_batch`) where a restart costs at least ``batch_restart_frac`` of the
        mean remaining work of ``g``'s jobs: then the job waits for one to end. A whole
        batch side by side on the smallest slices, grown into freed slices by restarts as
        jobs end, has the highest throughput but ends every job late; a few at a time end
        the first ones early and restart less (benchmarks/README.md, "No regret"). Cheap
        restarts make the growth cheap: no cap then (restart 30 s vs 600 s jobs, until
        their remaining work is under 300 s)."""
        pol, cap = self.pol, self.opts.batch_jobs
        jobs = sc.jobs_on(g)
        if pol.bursts.burst(sc):  # a burst: the landing layout's slots, no more
            return len(jobs) >= pol.bursts.opts.burst_jobs
        if cap <= 0 or len(jobs) < cap or not pol.in_batch(sc):
            return False
        work = sum(pol.work.remaining(sc.state, j) for j in jobs) / len(jobs)
        return pol.restarts.cost("") >= pol.bursts.opts.batch_restart_frac * work

    def fits_beside_pinned(self, g: str, job: str, sc: Scratch) -> bool:
        """Whether a layout keeps the pinned residents of ``g`` (jobs that cannot checkpoint
        keep their instance, and in a burst the landed ones, :meth:`landed`) and holds
        ``job`` too; a GPU without pinned residents always can
        (:meth:`candidate_gpus` checked the mix). Else the job would wait there for the pinned
        job to end while another GPU could take it."""
        jobs = sc.jobs_on(g)
        gs = sc.state.gpus[g]
        pinned = (self.pol.pinned(sc, jobs) | self.pol.bursts.landed(sc, g)) & set(gs.assignment)
        if not pinned:
            return True
        if not self.may_fit(sc, g, jobs, pinned, job):
            return False
        # The optimizer finds a layout for the mix that keeps the pinned on their instances.
        sp = self.pol.speeds(gs.geom, sc, [*jobs, job])
        current = {j: pl for j, pl in gs.assignment.items() if j in sp}
        return feasibility_for(gs.geom).holds(sp, current=current, pinned=pinned)

    def may_fit(self, sc: Scratch, g: str, jobs: list[str], pinned: set[str], job: str
                ) -> bool:
        """False only when no solve of :meth:`fits_beside_pinned` can succeed (issue 32: a burst's
        placement pass solved beside the pinned residents of every candidate GPU for every
        queued job): ``job`` is planned with the prior (no estimate, no estimate plugin), and
        no profile it has a prior speed on has an instance beside the pinned instances in a
        layout with an instance per job (:func:`~miso.sched.freeslots.room_beside`). The
        prior (:func:`~miso.sched.speeds.prior_speeds`) has a speed on exactly the profiles
        that hold the job's memory, :func:`fitting_profiles` (cached)."""
        pol = self.pol
        if job in pol.est or pol.estimates or not pol.estimator.needs_profile:
            return True  # its speeds' profiles are not the prior's: solve
        gs = sc.state.gpus[g]
        members = {*jobs, job}
        kept = frozenset([gs.assignment[j] for j in pinned if j in members])
        prior = fitting_profiles(gs.geom, sc.state.jobs[job].spec.memory_gb)
        return most_jobs_beside(gs.geom, kept, prior) >= len(members)

    def gpu_to_hold(self, sc: Scratch, job: str) -> str | None:
        """The GPU a starving ``job`` (fits nowhere, waited past ``starve_after`` typical
        works) gets: the one where it fits soonest once residents end (the fewest, shortest
        remaining works to wait for, :meth:`room_in`); nobody behind it is placed there until
        it fits, so the GPU drains to room for it instead of filling with smaller jobs that
        pass it. (The GPU with the fewest jobs, held before, could be two 17 GB jobs that
        leave a third no room while they run: the 16-GPU p95, issue 17.)"""
        cy = sc.cycle
        best = min(((wait, len(sc.jobs_on(g)), self.pol.gpu_index.get(g, 0), g)
                    for g in sc.state.gpus
                    if not cy.filters or cy.allowed(job, g, sc.jobs_on(g))
                    if (wait := self.room_in(sc, g, job)) is not None), default=None)
        return None if best is None else best[3]

    def room_in(self, sc: Scratch, g: str, job: str) -> float | None:
        """Work (full-GPU seconds) left to the last resident of ``g`` that must end before
        ``job`` fits beside the others, residents ending in order of their remaining work; 0
        when it fits now, None when it never fits ``g``."""
        st = sc.state
        geom = st.gpus[g].geom
        cap = min(self.pol.max_jobs, geom.model.max_instances)
        left = sorted((self.pol.work.remaining(st, j), st.jobs[j].spec.memory_gb)
                      for j in sc.jobs_on(g))
        mem = st.jobs[job].spec.memory_gb
        for k in range(len(left) + 1):
            if len(left) - k < cap and mix_feasible(geom, [m for _, m in left[k:]] + [mem]):
                return left[k - 1][0] if k else 0.0
        return None
