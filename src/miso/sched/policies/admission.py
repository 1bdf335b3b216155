"""miso+'s no-regret admission (issue 17): whether a newcomer alone on an idle GPU is worth
profiling, and whether a newcomer should share a GPU now or wait for a whole one, from the
arrival rate, the queue and the restart price.

The permit stage of :class:`~miso.sched.policies.misoplus.MisoPlus` (``pol.admission``; its
own options in :class:`AdmissionOptions`; it reads the policy ``pol``'s profiling run
``profile_run_s``, its arrival clock ``clock``, its learners ``work`` and ``restarts``, the jobs
that have run ``ran``, the measured speeds ``est`` and its ``speeds``/``arrival_within``; the
facts of one decision, and the GPU scan made once in it, are the cycle's, ``sc.cycle``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial, reduce
from operator import add
from typing import TYPE_CHECKING

from miso.optimize import remembering_optimizer
from miso.sched.freetimes import FreeTimes, Timed, WatchedDict, brute_soonest, end_time
from miso.sched.policies.base import Scratch
from miso.sched.policies.baselines import backfill_window
from miso.sched.policies.declined import declined_share
from miso.sched.unseen import UnseenResidents

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.misoplus import MisoPlus

#: When miso+ profiles a newcomer alone on an idle GPU (:meth:`Admission.profile_pays`).
PROFILE_WHEN = ("auto", "always", "never")


@dataclass(frozen=True)
class AdmissionOptions:
    """``profile_when``: when a lone newcomer is profiled (:data:`PROFILE_WHEN`);
    ``share_margin``: standard deviations of the offered load counted in :meth:`heavy_load`;
    ``load_samples``: arrivals before the load is known; ``wait_bias``: outside a fixed mix a
    newcomer waits for a whole GPU only when sharing looks this many times worse."""

    profile_when: str = "auto"
    share_margin: float = 0.0
    load_samples: int = 16
    wait_bias: float = 1.2

    def __post_init__(self) -> None:
        if self.profile_when not in PROFILE_WHEN:
            raise TypeError(f"profile_when must be one of {', '.join(PROFILE_WHEN)}, not "
                            f"{self.profile_when!r}")


#: GPUs whose times bound the free time without a scan (:meth:`Admission.free_bound`)
_BOUND_GPUS = 8
#: GPUs kept from a scan for the next bound, soonest free first
_SOONEST = 32


#: Before the arrival rate is known, a lone newcomer is profiled when profiling costs at most
#: this fraction of its remaining work.
LONG_JOB = 0.005


class Admission:
    """Profiling and sharing decisions that must never make a cluster worse than NoPart."""

    def __init__(self, pol: MisoPlus, opts: AdmissionOptions) -> None:
        self.pol = pol
        self.opts = opts
        self.soonest: list[str] = []   # the GPUs soonest free at the last scan
        #: whether a scan would record a job's work (:meth:`WorkLearner.note`): a resident
        #: reporting progress, not ended, not seen yet (sched/unseen.py: no scan)
        self.unseen = UnseenResidents()
        self.free = FreeTimes()  # the GPUs' free times (gpu_free_in), told of estimates
        pol.est = WatchedDict(self.free.job_changed, pol.est)  # changed (sched/freetimes.py)

    def heavy_load(self, sc: Scratch) -> bool:
        """Whether jobs will have to share GPUs: the arrivals' offered load (Little's law,
        :meth:`ArrivalClock.offered_load`, a lower bound) reaches the cluster's GPUs within
        ``share_margin`` standard deviations (busy GPUs are about Poisson-distributed).
        False while no arrival rate is known (a fixed mix, the first job) or once arrivals
        stopped; true in a burst (:meth:`Burst.burst`)."""
        pol, cy = self.pol, sc.cycle
        heavy = pol.bursts.burst(sc)
        # Once per cycle for the same inputs (the clock and the cluster do not change during
        # a decision; the typical work may, as works are noted).
        key = (heavy, pol.work.stats[0], pol.work.stats[1], len(sc.state.gpus))
        got = cy.memo.get("heavy_load")
        if got is not None and got[0] == key:
            return got[1]
        load = pol.clock.offered_load(pol.work.typical(), self.opts.load_samples)
        if not heavy and load is not None and not pol.clock.quiet(cy.now):
            heavy = load + self.opts.share_margin * load ** 0.5 >= len(sc.state.gpus)
        cy.memo["heavy_load"] = (key, heavy)
        return heavy

    def others_waiting(self, sc: Scratch, job: str) -> bool:
        """Whether, with fair share ordering the queue, another job waits: then a newcomer that
        passed up a shared slot to wait for a whole GPU would hand the slot to a job the
        order (priority, fair share) put after it, so it does not wait then. Without tenancy
        the wait rule stands as measured (benchmarks/README.md, "No regret")."""
        ten = sc.state.tenancy
        return ten is not None and ten.config.fair_share and \
            any(j != job for j in sc.queue(limit=2))

    def profile_pays(self, sc: Scratch, job: str) -> bool:
        """Whether profiling a newcomer alone on an idle GPU is worth its price (a restart
        at the MPS level switch, and the slow low level). Its MIG speeds only matter once it
        shares a GPU, so with ``profile_when="auto"`` it is profiled only when sharing is
        expected (:meth:`heavy_load`; at light load a newcomer rather waits for a whole GPU,
        :meth:`better_to_wait`). A job not profiled is planned with the prior, corrected by
        its observed rates."""
        pol, when = self.pol, self.opts.profile_when
        run_s = pol.profile_run_s(pol.restarts.cost(job))
        if when == "never" or pol.arrival_within(sc, run_s):
            return False
        if when == "always" or self.heavy_load(sc):
            return True
        # No load known yet (the first arrivals): a long job is profiled all the same, the
        # price being small against its run time and its chance to share some day.
        return pol.clock.offered_load(pol.work.default_s) is None and \
            run_s + pol.profile_s <= LONG_JOB * pol.work.remaining(sc.state, job)

    def better_to_wait(self, g: str, job: str, sc: Scratch, ahead: int) -> bool:
        """Whether ``job`` should wait for a whole GPU rather than share ``g`` now: the sum
        of the completion times of ``g``'s jobs and the newcomer, estimated both ways from
        their remaining work. Waiting: the residents keep their speeds, the newcomer starts
        when the ``ahead + 1``-th GPU has ended all its jobs (:meth:`gpu_free_in`) and runs
        alone. Sharing: everyone at their speed in the best layout for the mix, residents
        that move paying a restart (no growth counted: the estimate leans to waiting, which
        restarts nobody). At light load a GPU frees soon and waiting wins; two equal jobs
        finish sooner on average one after the other than side by side on slices.

        The waiting time grows with the free time, so when sharing is worse even with an
        upper bound of it (:meth:`free_bound`, a few GPUs' times) the scan of every GPU is
        not needed (:meth:`scan_point` says when it may be left out). A choice to wait is
        recorded with its figures (:func:`declined_share`)."""
        residents = sc.jobs_on(g)
        if not any(r in self.pol.ran for r in residents):
            return False  # nobody runs there yet: a plan for all of them restarts nobody
        self.scan_point(sc)
        got = self.both_ways(g, job, sc, residents)
        if got is None:
            return True  # no layout holds the mix
        share, own, waits, moved = got
        # The estimate leans to waiting (residents growing into freed slices later, and the
        # queue behind a waiting job, are not counted): outside a fixed mix a newcomer waits
        # only when sharing looks ``wait_bias`` times worse (1.2 measured best at 90 s).
        bias = 1.0 if self.pol.in_batch(sc) else self.opts.wait_bias
        # The waiting side's sum of completion times: the newcomer after the free time, then
        # its own work and each resident's time (added in this order, as floats).
        wait = reduce(add, waits, self.free_bound(sc, ahead) + own)
        if share < bias * wait:  # sharing is better than the bound says: the exact time
            wait = reduce(add, waits, self.gpu_free_in(sc, ahead) + own)
            if share < bias * wait:
                return False
        declined_share(self.pol, sc, g, job, share, wait, bias, moved)  # (declined.py)
        return True

    def both_ways(self, g: str, job: str, sc: Scratch, residents: list[str]
                  ) -> tuple[float, float, list[float], list[str]] | None:
        """(sum of completion times sharing ``g``, the newcomer's own time alone, each
        resident's time if it keeps its slice, the running residents sharing moves) for
        :meth:`better_to_wait`; None when no layout holds the mix."""
        rem = partial(self.pol.work.remaining, sc.state)
        geom = sc.state.gpus[g].geom
        sp = self.pol.speeds(geom, sc, [*residents, job])
        opt = remembering_optimizer(geom)  # asked again while the job waits: remembered
        current = sc.state.gpus[g].target_assignment()
        alone = opt.try_solve({r: sp[r] for r in residents})
        # Ties broken by fewest residents moved, as the re-plan itself would.
        shared = None if alone is None else opt.try_solve(
            sp, current={r: current[r] for r in residents if r in current})
        if alone is None or shared is None:
            return None
        own = rem(job)
        share = own / max(sp[job][shared.assignment[job].profile], 0.05)
        waits = []
        moved = []
        for r in residents:
            before = current.get(r) or alone.assignment[r]
            after = shared.assignment[r]
            waits.append(rem(r) / max(sp[r].get(before.profile, 0.5), 0.05))
            share += rem(r) / max(sp[r][after.profile], 0.05)
            if r in self.pol.ran and after != current.get(r):
                share += self.pol.restarts.cost(r)
                moved.append(r)
        return share, own, waits, moved

    def scan_point(self, sc: Scratch) -> None:
        """Where a decision's first :meth:`better_to_wait` scans every GPU: the scan is left
        for later (the cycle's ``memo["lazy"]``: the typical work then) when it would record
        no job's work (every resident reporting progress is seen) and no estimate changes
        during the decision (an estimator that needs profiles), so a later scan gives the
        same times; else it runs now (``memo["free_at"]``: the GPUs' free times)."""
        memo = sc.cycle.memo
        if "free_at" in memo or "lazy" in memo:
            return
        if self.pol.estimator.needs_profile and not self.unseen.any(sc.state, self.pol.work.seen):
            memo["lazy"] = self.pol.work.typical()
        else:
            self.gpu_free_in(sc, 0)

    def settle(self, sc: Scratch) -> None:
        """Run a scan left for later now, before this decision changes an estimate (an
        event hook after a placement pass, e.g. reclaim's): later asks read its times."""
        memo = sc.cycle.memo
        if "lazy" in memo and "free_at" not in memo:
            self.gpu_free_in(sc, 0)

    def free_bound(self, sc: Scratch, k: int) -> float:
        """At least :meth:`gpu_free_in`: while this decision's scan is left for later, the
        ``k+1``-th soonest of the GPUs soonest free at the last scan (their times now); else
        (no such bound, or the decision scanned) :meth:`gpu_free_in` itself."""
        memo, gpus = sc.cycle.memo, sc.state.gpus
        some = [g for g in self.soonest if g in gpus][:k + _BOUND_GPUS] \
            if "lazy" in memo and "free_at" not in memo else []
        if len(some) <= k:
            return self.gpu_free_in(sc, k)
        # Their end times, computed once per decision (extended as deeper asks need more):
        # the GPUs and the typical work do not change during it, so each is the same float.
        ends = memo.setdefault("soon_ends", [])
        if len(ends) < len(some):
            timer = self.gpu_timer(sc)
            ends += [timer(g)[0] for g in some[len(ends):]]
        return sorted(ends[:len(some)])[k]

    def gpu_timer(self, sc: Scratch) -> Callable[[str], Timed]:
        """:func:`end_time` of a GPU by id (an idle GPU: free now), with the decision's typical
        work (the one when its scan was left for later, ``memo["lazy"]``): what the scan, the
        index and the bound evaluate per GPU."""
        st, work, memo = sc.state, self.pol.work, sc.cycle.memo
        typical = (lambda: memo["lazy"]) if "lazy" in memo else work.typical
        ctx = (st.now, st.jobs, self.pol.est, work.seen, work.note, typical)

        def evaluate(g: str) -> Timed:
            gs = st.gpus[g]
            return end_time(gs.jobs, gs.assignment, gs.geom.model.full_profile().name, ctx)
        return evaluate

    def gpu_free_in(self, sc: Scratch, k: int) -> float:
        """Seconds until the ``k+1``-th soonest GPU has finished all its jobs (each job's
        remaining work at its current slice's speed; the cluster has GPUs: a job is weighed
        on one). Once per decision, for as many GPUs as its placement pass may ask (``k``,
        the jobs ahead, stays below the backfill window): from the index of free times
        (:class:`FreeTimes`, only GPUs that changed or may be among the soonest are
        evaluated), or a scan of every GPU when it would record a job's work (a scan's side
        effect, in GPU order); the soonest GPUs' ids are kept for :meth:`free_bound`."""
        memo, st = sc.cycle.memo, sc.state
        times = memo.get("free_at")
        if times is None:
            timer = self.gpu_timer(sc)
            if self.unseen.any(st, self.pol.work.seen):
                got = brute_soonest(st.gpus, len(st.gpus), timer)  # in GPU order, ties too
            else:
                typical = memo["lazy"] if "lazy" in memo else self.pol.work.typical()
                got = self.free.soonest(st, max(_SOONEST, backfill_window(sc) + 1), typical, timer)
            self.soonest = [g for _, g in got[:_SOONEST]]
            times = memo["free_at"] = [t for t, _ in got]
        if k < len(times):
            return times[k]
        # Deeper in the queue: every GPU frees again after about its median job's time.
        return times[k % len(times)] + (k // len(times)) * max(times[len(times) // 2], 1.0)
