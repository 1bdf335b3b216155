"""miso+'s no-regret admission (issue 17): whether a newcomer alone on an idle GPU is worth
profiling, and whether a newcomer should share a GPU now or wait for a whole one, from the
arrival rate, the queue and the restart price.

A mixin of :class:`~miso.sched.policies.misoplus.MisoPlus` (it reads the policy's knobs
``profile_when``, ``share_margin``, ``profile_levels``, ``profile_s``, ``restart_s``,
``default_remaining_s``, its arrival clock ``clock``, ``now``, the jobs that have run
``ran``, the measured speeds ``est`` and its ``speeds``/``remaining``/``arrival_within``).
"""

from __future__ import annotations

import heapq
import random
from functools import cache
from typing import Any

from miso.mig import Geometry, Placement, enumerate_layouts, multiset
from miso.optimize import OptimizerError, optimizer_for
from miso.sched.policies.base import Scratch, fitting_profiles
from miso.sched.speeds import workload_speeds
from miso.workloads import catalogue

#: When miso+ profiles a newcomer alone on an idle GPU (:meth:`Admission.profile_pays`).
PROFILE_WHEN = ("auto", "always", "never")

#: Before the arrival rate is known, a lone newcomer is profiled when profiling costs at most
#: this fraction of its remaining work.
LONG_JOB = 0.005


class Admission:
    """Profiling and sharing decisions that must never make a cluster worse than NoPart."""

    profile_when: str
    share_margin: float
    profile_levels: tuple[int, ...]
    profile_s: float
    restart_s: float
    default_remaining_s: float
    clock: Any
    now: float
    ran: set[str]
    est: dict[str, dict[str, float]]
    ahead: int
    free_at: tuple[int, list[float]] | None
    calls: int
    speeds: Any
    remaining: Any
    typical_work: Any
    in_batch: Any
    wait_bias: float
    load_samples: int
    landing_samples: int
    arrival_within: Any
    burst: Any

    def heavy_load(self, sc: Scratch) -> bool:
        """Whether jobs will have to share GPUs: the arrivals' offered load (Little's law,
        :meth:`ArrivalClock.offered_load`) reaches the cluster's GPUs within ``share_margin``
        standard deviations (busy GPUs are about Poisson-distributed). False while no arrival
        rate is known (a fixed mix, the first job) or once arrivals stopped; true in a burst
        (:meth:`Burst.burst`)."""
        if self.burst():
            return True
        load = self.clock.offered_load(self.typical_work(), self.load_samples)
        if load is None or self.clock.quiet(self.now):
            return False
        # The rate is estimated from m arrivals (relative error ~ 1/sqrt(m)): take its lower
        # bound, so a few short gaps early on do not look like a busy cluster.
        load *= 1.0 - 1.0 / len(self.clock.long) ** 0.5
        return load + self.share_margin * load ** 0.5 >= len(sc.state.gpus)

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
        run_s = len(self.profile_levels) * self.profile_s + \
            (len(self.profile_levels) - 1) * self.restart_s
        if self.profile_when == "never" or self.arrival_within(run_s):
            return False
        if self.profile_when == "always" or self.heavy_load(sc):
            return True
        if self.clock.offered_load(self.default_remaining_s) is None:
            # No load known yet (the first arrivals): a long job is profiled all the same,
            # the price being small against its run time and its chance to share some day.
            return run_s + self.profile_s <= LONG_JOB * self.remaining(job)
        return False

    def better_to_wait(self, g: str, job: str, sc: Scratch) -> bool:
        """Whether ``job`` should wait for a whole GPU rather than share ``g`` now: the sum
        of the completion times of ``g``'s jobs and the newcomer, estimated both ways from
        their remaining work. Waiting: the residents keep their speeds, the newcomer starts
        when the ``ahead + 1``-th GPU has ended all its jobs (:meth:`gpu_free_in`) and runs
        alone. Sharing: everyone at their speed in the best layout for the mix, residents
        that move paying a restart (no growth counted: the estimate leans to waiting, which
        restarts nobody). At light load a GPU frees soon and waiting wins; two equal jobs
        finish sooner on average one after the other than side by side on slices."""
        residents = sc.jobs_on(g)
        if not any(r in self.ran for r in residents):
            return False  # nobody runs there yet: a plan for all of them restarts nobody
        t_free = self.gpu_free_in(sc, self.ahead)
        if t_free is None:
            return False
        geom = sc.state.gpus[g].geom
        sp = self.speeds(geom, sc, [*residents, job])
        opt = optimizer_for(geom)
        current = sc.state.gpus[g].target_assignment()
        try:
            alone = opt.solve({r: sp[r] for r in residents})
            # Ties broken by fewest residents moved, as the re-plan itself would.
            shared = opt.solve(sp, current={r: current[r] for r in residents if r in current})
        except OptimizerError:
            return True
        wait = t_free + self.remaining(job)
        share = self.remaining(job) / max(sp[job][shared.assignment[job].profile], 0.05)
        for r in residents:
            before = current.get(r) or alone.assignment[r]
            after = shared.assignment[r]
            wait += self.remaining(r) / max(sp[r].get(before.profile, 0.5), 0.05)
            share += self.remaining(r) / max(sp[r][after.profile], 0.05)
            if r in self.ran and after != current.get(r):
                share += self.restart_s
        # The estimate leans to waiting (residents growing into freed slices later, and the
        # queue behind a waiting job, are not counted): outside a fixed mix a newcomer waits
        # only when sharing looks ``wait_bias`` times worse (1.2 measured best at 90 s).
        bias = 1.0 if self.in_batch() else self.wait_bias
        return share >= bias * wait

    def batch_plan(self, g: str, sc: Scratch
                   ) -> tuple[tuple[Placement, ...] | None, dict[str, Placement], list[str]]:
        """How a batch (jobs of ``g`` of which none has run) lands: (a static layout and its
        assignment, or None to let the re-plan choose; the jobs that wait for a freed
        instance, latest submitted first). Candidates: the best layout for every FIFO prefix
        of the batch, and every maximal layout (OptSta's family) filled FIFO, each job on
        the largest free instance that holds it; the one with the smallest sum of completion
        times (:meth:`landing_cost`) wins."""
        st = sc.state
        geom = st.gpus[g].geom
        jobs = sorted(sc.jobs_on(g), key=lambda j: (st.jobs[j].submitted_at, j))
        if len(jobs) < 2:
            return None, {}, []
        queued = sc.queue(8)  # they wait for this GPU's instances too
        sp = self.speeds(geom, sc, [*jobs, *queued])
        opt = optimizer_for(geom)
        comp = {p.name: p.compute_slices for p in geom.profiles}
        scen = self.speed_scenarios(geom, sc, [*jobs, *queued], sp)
        best: tuple[float, tuple[Placement, ...] | None, dict[str, Placement], list[str]] | None
        best = None
        for n in range(1, len(jobs) + 1):
            try:
                sol = opt.solve({j: sp[j] for j in jobs[:n]})
            except OptimizerError:
                continue
            cost = self.scenario_cost(scen, comp, dict(sol.assignment), [],
                                      [*jobs[n:], *queued])
            if best is None or cost < best[0] - 1e-6:
                best = (cost, None, {}, jobs[n:])
        for lay in _landing_layouts(geom):
            free = sorted(lay, key=lambda pl: (-comp[pl.profile], pl.start))
            asg: dict[str, Placement] = {}
            wait = []
            for j in jobs:
                pl = next((x for x in free if x.profile in sp[j]), None)
                if pl is None:
                    wait.append(j)
                    continue
                free.remove(pl)
                asg[j] = pl
            if not asg:
                continue
            cost = self.scenario_cost(scen, comp, asg, free, [*wait, *queued])
            if best is None or cost < best[0] - 1e-6:
                best = (cost, tuple(sorted(lay)), asg, wait)
        if best is None:
            return None, {}, []
        return best[1], best[2], best[3][::-1]

    def speed_scenarios(self, geom: Geometry, sc: Scratch, jobs: list[str],
                        sp: dict[str, dict[str, float]]) -> list[dict[str, dict[str, float]]]:
        """Speeds to judge a landing by: the estimates ``sp`` alone, or with
        ``landing_samples`` > 0 that many draws where each job not measured yet (planned with
        the prior) takes the speeds of a catalogue workload that fits its memory. A
        completion time is work / speed, so the mean speed underrates the slow jobs' time
        (1/E[s] < E[1/s]): averaging over draws does not."""
        n = self.landing_samples
        unknown = [j for j in jobs if j not in self.est]
        if n <= 0 or not unknown:
            return [sp]
        rng = random.Random(len(jobs))  # deterministic: same batch, same choice
        out = []
        for _ in range(n):
            d = dict(sp)
            for j in unknown:
                pool = _catalogue_speeds(geom, fitting_profiles(
                    geom, sc.state.jobs[j].spec.memory_gb))
                if pool:
                    d[j] = dict(pool[rng.randrange(len(pool))])
            out.append(d)
        return out

    def scenario_cost(self, scen: list[dict[str, dict[str, float]]], comp: dict[str, int],
                      running: dict[str, Placement], free: list[Placement],
                      waiting: list[str]) -> float:
        """Mean :meth:`landing_cost` over the speed scenarios."""
        return sum(self.landing_cost(sp, comp, running, free, waiting)
                   for sp in scen) / len(scen)

    def landing_cost(self, sp: dict[str, dict[str, float]], comp: dict[str, int],
                     running: dict[str, Placement], free: list[Placement],
                     waiting: list[str]) -> float:
        """Sum of the completion times (from now) of the ``running`` jobs on their instances
        and of the ``waiting`` ones, each taking in order the largest instance that is or
        becomes free and holds it (nobody moves: a static "landing" layout)."""
        ends = [(self.remaining(j) / max(sp[j][pl.profile], 0.05), j, pl)
                for j, pl in running.items()]
        heapq.heapify(ends)
        pool = sorted(free, key=lambda pl: -comp[pl.profile])
        queue = list(waiting)
        total = 0.0
        t = 0.0
        while True:
            for w in list(queue):
                pl = next((x for x in pool if x.profile in sp[w]), None)
                if pl is not None:
                    pool.remove(pl)
                    queue.remove(w)
                    heapq.heappush(ends, (t + self.remaining(w) / max(sp[w][pl.profile], 0.05),
                                          w, pl))
            if not ends:
                break
            t, _, pl = heapq.heappop(ends)
            total += t
            pool.append(pl)
            pool.sort(key=lambda x: -comp[x.profile])
        return total + 1e12 * len(queue)  # a job no instance holds: never

    def gpu_free_in(self, sc: Scratch, k: int) -> float | None:
        """Seconds until the ``k+1``-th soonest GPU has finished all its jobs (each job's
        remaining work at its current slice's speed); None when fewer GPUs. One scan of the
        GPUs per decision."""
        if self.free_at is None or self.free_at[0] != self.calls:
            st = sc.state
            times = []
            for gs in st.gpus.values():
                t = 0.0
                for j in gs.jobs:
                    pl = gs.assignment.get(j)
                    v = self.est.get(j)
                    s = (v or {}).get(pl.profile, 0.5) if pl is not None and v else \
                        (1.0 if pl is None or pl.profile == gs.geom.model.full_profile().name
                         else 0.5)
                    t = max(t, self.remaining(j) / max(s, 0.05))
                times.append(t)
            times.sort()
            self.free_at = (self.calls, times)
        times = self.free_at[1]
        if not times:
            return None
        if k < len(times):
            return times[k]
        # Deeper in the queue: every GPU frees again after about its median job's time.
        return times[k % len(times)] + (k // len(times)) * max(times[len(times) // 2], 1.0)


@cache
def _catalogue_speeds(geom: Geometry, fits: tuple[str, ...]
                      ) -> tuple[tuple[tuple[str, float], ...], ...]:
    """Each catalogue workload's speeds on the profiles in ``fits`` (one draw each)."""
    fit = set(fits)
    out = []
    for w in catalogue().values():
        v = workload_speeds(geom, w)
        if fit <= set(v):  # a workload that runs on every profile the job fits
            out.append(tuple((p, s) for p, s in v.items() if p in fit))
    return tuple(out)


@cache
def _landing_layouts(geom: Geometry) -> tuple[tuple[Placement, ...], ...]:
    """One maximal layout per multiset of profiles (OptSta's candidates), the whole GPU
    excluded (a batch of several jobs)."""
    seen: dict[tuple[str, ...], tuple[Placement, ...]] = {}
    for lay in enumerate_layouts(geom, maximal=True):
        ms = multiset(geom, lay)
        if len(lay) > 1 and ms not in seen:
            seen[ms] = tuple(lay)
    return tuple(seen.values())
