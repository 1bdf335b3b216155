"""miso+'s burst regime (issue 17, "static when static is best"): many short jobs arriving
within a fraction of one job's length (the demo's stream: 20 jobs of ~20 s in ~20 s on 4
GPUs). There a GPU repartitioned at every arrival restarts its first jobs again and again,
and OptSta's fixed layout, which lands every job on a slice that stays, wins. In a burst each
GPU's plan keeps slots for the next arrivals (a "landing" layout of ``burst_jobs`` instances,
OptSta's family), so they join it without restarting anyone, and the jobs are planned as a
fixed mix (``in_batch``: harmonic prior, at most ``batch_jobs`` per GPU while restarts are
dear). Landed jobs keep their slices, and a newcomer takes a free slot before it restarts a
job that started alone on a whole GPU before the burst showed.

The burst regime of :class:`~miso.sched.policies.misoplus.MisoPlus` (``pol.bursts``; its own
options in :class:`BurstOptions`; it reads the policy ``pol``'s arrival clock ``clock``, its
profiling run ``profile_run_s``, its learners ``work`` and ``restarts``, ``arrival_within`` and
``candidate_gpus``; the facts of one decision from the cycle ``sc.cycle``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from miso.sched.freeslots import FreeSlots, free_slots
from miso.sched.policies.base import Scratch, fitting_profiles
from miso.sched.speeds import prior_speeds

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.misoplus import MisoPlus
    from miso.sched.state import ClusterState

#: Share of the starting load (``burst_load`` x GPUs) that keeps a burst going.
BURST_HOLD = 0.5


@dataclass(frozen=True)
class BurstOptions:
    """``burst_jobs``: slots per GPU in a burst's landing layout (0: no burst regime);
    ``burst_samples``: arrivals before the test; ``burst_load``: the offered load, in GPUs,
    that starts a burst; ``batch_restart_frac``: a profiling run must cost at least this
    share of a typical job's work (short jobs), as a restart must for a fixed mix's cap
    (:meth:`GpuChoice.batch_full`)."""

    burst_jobs: int = 3
    burst_samples: int = 3
    burst_load: float = 1.5
    batch_restart_frac: float = 0.1


class Burst:
    """Whether arrivals come as a burst, and the landing slots a GPU keeps in one."""

    def __init__(self, pol: MisoPlus, opts: BurstOptions) -> None:
        self.pol = pol
        self.opts = opts
        self.bursting = False  # the last :meth:`test` answer (its hysteresis, set by burst)
        #: the GPUs with 0 < residents < ``burst_jobs`` and a free slot (issue 32)
        self.slots = FreeSlots(pol.occ.key, pol.occ.tags,
                               lambda cls: 0 < cls[0] < opts.burst_jobs)  # type: ignore[index]

    def burst(self, sc: Scratch) -> bool:
        """:meth:`test`, computed once per decision: asked again in the same cycle with the
        same inputs (what may change while a decision runs: the works and restart costs
        measured during it, the queue's emptiness, the cluster's size), the cycle's answer.
        Its hysteresis settles in one call (a wider window once bursting), so that answer is
        the one a recomputation would give (issue 17); the answer is kept as the hysteresis
        of the next test."""
        pol, st = self.pol, sc.state
        key = (pol.work.stats[1], pol.restarts.stats[1], bool(st.queue), len(st.gpus),
               len(pol.gpu_index))
        got = sc.cycle.memo.get("burst")
        if got is None or got[0] != key:
            got = sc.cycle.memo["burst"] = (key, self.test(sc))
            self.bursting = got[1]
        return got[1]

    def test(self, sc: Scratch) -> bool:
        """A burst: from ``burst_samples`` arrivals on, their offered load (lower bound, as
        :meth:`heavy_load`) is ``burst_load`` times the GPUs, and the next newcomer is
        expected on each GPU before a lone newcomer's profiling run would end (arrivals much
        faster than a restart-and-profile cycle: 60 s between jobs on 16-40 GPUs with 30-300
        s restarts is not one), and that cycle costs ``batch_restart_frac`` of a typical
        job's work at least (short jobs: long ones pay a restart back, 14 jobs of 20,000 s
        arriving a second apart share GPUs as usual). No burst before some job's work is
        known (16 jobs on 16 GPUs looked like one with 3,000 s guessed). It ends when
        arrivals stop and its queue has drained. Reads the last answer (``bursting``, kept by
        :meth:`burst`); changes nothing."""
        pol, opts, st = self.pol, self.opts, sc.state
        if opts.burst_jobs <= 0:
            return False
        if pol.clock.quiet(sc.cycle.now):
            # Arrivals stopped: the burst's queue still drains onto the landing slots.
            return self.bursting and bool(st.queue)
        work = self.burst_work(st)
        load = None if work is None else pol.clock.offered_load(work, opts.burst_samples)
        if load is None or work is None:
            return False
        run_s = pol.profile_run_s(pol.restarts.cost(""))
        # Once in a burst, a lower load keeps it (half): the work estimate moves as jobs
        # report, and a burst that flickers off mid-plan drops its landing slots.
        hold = BURST_HOLD if self.bursting else 1.0
        return (load >= hold * opts.burst_load * len(st.gpus)
                # once in a burst, measured (cheap) restarts do not end it
                and pol.arrival_within(sc, run_s * (2.0 if self.bursting else 1.0))
                and run_s >= opts.batch_restart_frac * work)

    def burst_work(self, st: ClusterState) -> float | None:
        """A typical job's work as the burst test sees it: the mean work measured so far, else
        the mean declared at submission, else the mean work left that the jobs have reported
        so far (full-GPU seconds), before the policy has priced any of them
        (:meth:`WorkLearner.typical` learns a job's work only when it plans its GPU, and a job
        alone on a whole GPU is not re-planned): live, the first jobs of a burst report within
        a second, so the burst is seen by the third arrival rather than when the fifth finds
        every GPU taken and the first four must be restarted to land the rest. None when
        nobody reported yet. Reads, never records; only the GPUs' residents (not every job
        the cluster has seen)."""
        if self.pol.work.stats[1]:
            return self.pol.work.typical()
        known = [w for w in self.pol.clock.work if w is not None]  # declared at submission
        if not known:  # reported
            known = [p[1] for gs in st.gpus.values() for j in gs.jobs
                     if (p := st.jobs[j].progress) is not None and st.jobs[j].finished_at is None]
        return sum(known) / len(known) if known else None

    def landed(self, sc: Scratch, g: str) -> set[str]:
        """In a burst, the residents of ``g`` on a slice (not the whole GPU): they keep it,
        as OptSta's jobs keep theirs, so a newcomer joins ``g`` only on a free slot. Empty
        outside a burst."""
        if not self.burst(sc):
            return set()
        gs = sc.state.gpus[g]
        full = gs.geom.model.full_profile().name
        return {j for j, pl in gs.assignment.items() if pl.profile != full}

    def landing_gpu(self, sc: Scratch, g: str, job: str, held: str | None) -> str:
        """In a burst, where ``job`` goes instead of ``g`` (the least crowded GPU) when
        joining ``g`` would restart its running jobs (a job alone on the whole GPU, started
        before the burst showed): the least crowded GPU with a free landing slot for it, so
        that job keeps its GPU until a newcomer has nowhere else to go (a short first job
        may end meanwhile; OptSta's jobs never restart). ``g`` itself otherwise. The GPUs
        with a free slot come from the index (:mod:`miso.sched.freeslots`: only GPUs with
        0 < residents < ``burst_jobs``), not a scan; tests/test_freeslots.py checks it
        against the scan."""
        if not sc.jobs_on(g) or not self.burst(sc) or free_slots(sc, g, fitting_profiles(
                sc.state.gpus[g].geom, sc.state.jobs[job].spec.memory_gb)) > 0:
            return g
        return next((h for _, h in self.pol.candidate_gpus(sc, job, self.slots.occ)  # a free slot
                     if h != g and h != held), g)

    def landing_slots(self, sc: Scratch, g: str, jobs: list[str]) -> dict[str, Any]:
        """In a burst, phantom newcomers (prior speeds, the median newcomer's memory) up to
        ``burst_jobs`` jobs on ``g``: the plan leaves their slices free for the next
        arrivals. Empty outside a burst or when ``g`` is full."""
        if not self.burst(sc):
            return {}
        gs = sc.state.gpus[g]
        free = min(self.opts.burst_jobs, gs.geom.model.max_instances) - len(jobs)
        ghost = prior_speeds(gs.geom, self.pol.clock.median_memory(), harmonic=True)
        return {f"\x00landing-{i}": ghost for i in range(free)} if ghost else {}
