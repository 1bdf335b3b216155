"""``miso+`` (ours): MISO redesigned around what restarts really cost; see :class:`MisoPlus`.
The paper's policy, which it extends, is :mod:`miso.sched.policies.miso`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from miso.mig import Geometry
from miso.optimize import optimizer_for
from miso.sched.decisions import ApplyLayout, Decision, RequeueCause, StartProfiling
from miso.sched.events import (
    Event,
    JobSpeedChanged,
    JobSubmitted,
    ProfilingFinished,
    SpeedObserved,
    Tick,
)
from miso.sched.fairspeed import SpeedFloor
from miso.sched.modelplace import for_geometry
from miso.sched.policies import observed
from miso.sched.policies.admission import Admission, AdmissionOptions
from miso.sched.policies.arrivals import ArrivalClock
from miso.sched.policies.base import Scratch
from miso.sched.policies.baselines import backfill_window
from miso.sched.policies.burst import Burst, BurstOptions
from miso.sched.policies.declined import declined_plan
from miso.sched.policies.economy import EconomyOptions, RestartEconomy, Speeds
from miso.sched.policies.estimates import SpeedPlugin
from miso.sched.policies.explain import explain_plan
from miso.sched.policies.framework import Entitlement, records_signature, take_options
from miso.sched.policies.learners import RestartCosts, WorkLearner
from miso.sched.policies.miso import Miso
from miso.sched.policies.placing import ChoiceOptions, GpuChoice
from miso.sched.policies.rebalance import Rebalancing
from miso.sched.reservecost import headroom_pays
from miso.sched.speeds import prior_speeds
from miso.sched.state import ClusterState


@dataclass(frozen=True)
class PlusOptions:
    """The plan stage's and the learners' options (see :class:`MisoPlus`): the configured
    restart price ``restart_s`` and its learner ``restart_costs`` (:class:`RestartCosts`, built
    with ``restart_s``; an experiment may put another in a profile); arrivals stop
    after ``quiet_gaps`` mean gaps (:class:`ArrivalClock`); a lone newcomer's
    ``profile_levels``; ``starve_after`` typical works; the ``estimates`` plugins."""

    restart_s: float = 60.0
    profile_levels: tuple[int, ...] = (14, 100)
    quiet_gaps: float = 8.0
    starve_after: float = 8.0
    restart_costs: type[RestartCosts] = RestartCosts
    estimates: tuple[SpeedPlugin, ...] = ()


#: miso+'s option records, one per stage: the policy's options are their fields, each given to
#: every record that names it.
RECORDS = (PlusOptions, EconomyOptions, BurstOptions, ChoiceOptions, AdmissionOptions)


class MisoPlus(Miso):
    """Ours: MISO redesigned around restart economy (what each rule was worth when it was a
    switch: benchmarks/history/simulator.md, "What each idea is worth"):

    * newcomer-only profiling: a job's MIG speeds are its own (MIG isolates), so residents
      are never re-profiled. A newcomer that lands on an idle GPU is profiled there alone (one
      real job padded by the dummy: inside the predictor's training distribution), at
      ``profile_levels`` (100 % last, so it keeps running at 100 % afterwards: one level switch
      for two levels); a newcomer that joins occupied GPUs is placed with the catalogue-average
      prior (:func:`~miso.sched.speeds.prior_speeds`) instead of stopping the residents to profile.
    * restart economy: a re-plan maximises throughput minus, per running job that would
      move, the work its restart throws away over the plan's horizon
      (``restart_s x speed / horizon``, the horizon being the median remaining time of the
      GPU's jobs, from their progress reports (:class:`~miso.sched.events.JobProgress` folded
      into their state), divided by the re-plans expected meanwhile, see
      :meth:`RestartEconomy.prices`); so a GPU is repartitioned only when the gain beats the
      restarts.
    * pinning: a job that cannot checkpoint is never restarted once it has run
      (the optimizer takes it as a hard constraint; it is never profiled or rebalanced).
    * rebalancing: when nothing queues, a job of a crowded GPU moves onto an idle GPU if the
      time it saves (its remaining work at its slice's speed vs on the full GPU) beats a restart.
    * ``reserve``: while jobs keep arriving, nothing queues and no GPU is less crowded, a
      plan keeps one slice free
      for the next newcomer when one is expected on the GPU within its jobs' remaining time
      (only where that restarts nobody), so the arrival itself restarts nobody.
    * backfill: a queued job that fits no GPU (too much memory for what is free) does not
      hold up the smaller ones behind it (MISO waits FIFO).
    * observed MIG rates replace predictions (or the prior) once the job's full-GPU rate is
      known; a phase change rescales a job's estimates by observed/baseline instead of
      stopping its GPU to re-profile (a job alone on its GPU is re-profiled alone).
    * ``profile_when`` (no regret, issue 17): ``"auto"`` profiles a lone newcomer only when
      sharing is expected (:meth:`heavy_load`: the arrivals' offered load reaches the GPUs,
      ``share_margin`` standard deviations included); ``"always"`` is the issue-8 rule,
      ``"never"`` plans every job with the prior and its observed rates.
    * ``wait_for_gpu``: at light load a newcomer that would restart a running job to share
      its GPU waits for a whole GPU instead when that ends the jobs sooner on average
      (:meth:`better_to_wait`), outside a fixed mix only when sharing looks ``wait_bias``
      times worse.
    * learned restart costs (``restart_costs``): each job's restart cost is measured (from
      the plan that restarts it to its first progress report after the relaunch) and prices
      its next restarts; jobs not measured yet are priced at the mean measured cost.
    * ``estimates``: estimate plugins (:mod:`~miso.sched.policies.estimates`), none
      shipped; issue 19's experiments, measured no better (benchmarks/README.md,
      "Predictor"), are plugins in :mod:`miso.sched.experiments`.
    * batch arrivals: jobs submitted in one instant before any arrival rate is known (a
      fixed mix) are planned together at the instant's end, so none starts only to be
      restarted by the next. In a fixed mix (:meth:`in_batch`) the prior is the harmonic
      mean, at most ``batch_jobs`` run per GPU when restarts are dear
      (``batch_restart_frac``) and plans stand for the ``batch_horizon_quantile``.
    * ``starve_after``: a queued job that fits nowhere and has waited that many typical
      works (:meth:`WorkLearner.typical`) gets a GPU held for it (:meth:`gpu_to_hold`, the one
      where it fits soonest): backfilled small jobs no longer pass it forever (the p95 of
      a saturated cluster; 8 measured best of 4-12, benchmarks/README.md "No regret").
    * ``burst_jobs``: many short jobs arriving within a fraction of one job's length
      (:meth:`burst`) land on a layout of that many slots per GPU that stays (OptSta's
      family), planned as a fixed mix; 0 turns it off.

    Each stage is a component with its own frozen options record (:class:`AdmissionOptions`,
    :class:`BurstOptions`, :class:`ChoiceOptions`, :class:`EconomyOptions`), built here from
    the policy's options; the facts of one decision are the cycle's (``sc.cycle``), not
    fields of the policy.
    """

    name = "miso+"
    #: fair share's filter with the speed floor (issue 31: fairspeed.py)
    filters = (Entitlement(floors=(SpeedFloor(),)),)

    def __init__(self, **options: Any) -> None:
        """``options``: the fields of :data:`RECORDS` (each stage gets its own record), the
        rest MISO's."""
        rec = take_options(RECORDS, options)  # (framework.py)
        super().__init__(**options)
        o = self.opts = rec[PlusOptions]
        self.estimates = tuple(p.build() for p in o.estimates)  # estimates.py
        self.work = WorkLearner()  # learners.py
        self.restarts = o.restart_costs(o.restart_s)
        self.clock = ArrivalClock(o.quiet_gaps)
        self.ref_rate: dict[str, float] = {}
        self.base_est: dict[str, dict[str, float]] = {}   # estimates before a rescale
        self.ran: set[str] = set()          # jobs that have made progress
        self.learned: dict[str, dict[str, float]] = {}  # prior jobs: observed speeds
        # the stages (plugins with their own options, reading this policy's learners)
        self.economy = RestartEconomy(self, rec[EconomyOptions])  # permit, reserve (economy.py)
        self.bursts = Burst(self, rec[BurstOptions])  # the burst regime (burst.py)
        self.choice = GpuChoice(self, rec[ChoiceOptions])  # filter/score/permit (placing.py)
        self.admission = Admission(self, rec[AdmissionOptions])  # permit: profile, share, wait
        self.rebalancer = Rebalancing(self)  # post-bind: moves onto idle GPUs (rebalance.py)
        self.declines: dict[str, tuple[Any, ...]] = {}  # last decline per GPU/job (declined.py)

    def profile_run_s(self, restart_s: float) -> float:
        """How long a lone newcomer's profiling run takes: every MPS level of
        ``profile_levels`` (100 % last, so it keeps running afterwards) for ``profile_s``, and
        a restart (``restart_s``) at each level switch."""
        n = len(self.opts.profile_levels)
        return n * self.profile_s + (n - 1) * restart_s

    def restart_price(self, job: str) -> float:
        """The one restart price (:meth:`RestartCosts.cost`: ``job``'s learned cost, else the
        mean learned, else the configured ``restart_s``): preemption and reclaim price their
        victims with it, as plans, admission and rebalancing do."""
        return self.restarts.cost(job)

    # -- inputs -----------------------------------------------------------------------------
    def decide(self, now: float, event: Event, state: ClusterState) -> list[Decision]:
        self.rebalancer.note(event, state)
        if isinstance(event, JobSubmitted):
            self.clock.note(now, event.job.memory_gb, event.job.duration_hint_s)
        for j in self.restarts.learn(state):  # their price changed: re-rank their GPUs
            self.rebalancer.changed(state.jobs[j].gpu)
        out = super().decide(now, event, state)
        self.restarts.note_plans(state, self.ran, now, out)
        if isinstance(event, JobSubmitted):
            self.quiet_wakeup(out)
        return out

    def quiet_wakeup(self, out: list[Decision]) -> None:
        """A timer for when arrivals count as stopped (:meth:`ArrivalClock.quiet_from`), one
        at a time."""
        at = self.clock.quiet_from()
        if at is not None:
            self.wake_once(out, at, "quiet")  # (base.py)

    def has_room(self, sc: Scratch, job: str) -> bool:
        """Whether some GPU holds ``job`` beside its pinned residents, as placement asks (fair
        share's reclaim asks first: a GPU held by a job that cannot checkpoint is no room for
        the waiting owner, issue 26)."""
        return next(self.choice.fitting(sc, job), None) is not None

    def on_profiled(self, now: float, ev: ProfilingFinished, sc: Scratch) -> None:
        self.admission.settle(sc)  # estimates change below
        super().on_profiled(now, observed.on_profiled(self, ev), sc)  # learner (observed.py)

    def on_speed_observed(self, now: float, ev: SpeedObserved, sc: Scratch) -> None:
        self.admission.settle(sc)
        observed.on_speed_observed(self, ev, sc)

    def on_speed_changed(self, now: float, ev: JobSpeedChanged, sc: Scratch) -> None:
        self.admission.settle(sc)
        observed.on_speed_changed(self, now, ev, sc)

    def on_tick(self, now: float, ev: Tick, sc: Scratch) -> None:
        """miso+'s timers (MISO's re-profiling timers are never set: miso+ rescales the
        estimates instead): the end of a batch's instant, and arrivals stopped (then the GPUs
        that hold jobs and idle slices, or a lone job on a slice, are re-planned with the long
        horizon)."""
        if ev.tag == "batch":
            self.replan_dirty(now, sc)  # a busy GPU stays dirty, as replan would leave it
        elif ev.tag == "quiet" and not self.clock.quiet(now):  # (a mean gap is known)
            self.quiet_wakeup(sc.out)
        elif ev.tag == "quiet":
            for g, gs in sc.state.gpus.items():
                full = gs.geom.model.full_profile().name
                if gs.jobs and (len(gs.layout) > len(gs.jobs) or len(gs.jobs) == 1 and any(
                        pl.profile != full for pl in gs.assignment.values())):
                    self.replan(now, g, sc)

    def pinned(self, sc: Scratch, jobs: list[str]) -> set[str]:
        return {j for j in jobs if j in self.ran and not sc.state.jobs[j].spec.checkpointable}

    def in_batch(self, sc: Scratch) -> bool:
        """A fixed mix: several jobs came, all at one instant (no arrival rate known)."""
        return len(self.clock.times) >= 2 and self.clock.gap is None or self.bursts.burst(sc)

    def arrival_within(self, sc: Scratch, seconds: float) -> bool:
        """A newcomer is expected on a given GPU within ``seconds`` (arrivals spread evenly
        over the GPUs): then a lone newcomer is not profiled, since the next arrival would
        wait for the profiling run and the job will share its GPU (planned with the prior)
        before its profile matters."""
        gap = self.clock.gap
        return (gap is not None and not self.clock.quiet(sc.cycle.now)
                and gap * len(self.gpu_index) < seconds)

    def speeds(self, geom: Geometry, sc: Scratch, jobs: list[str]) -> Speeds:
        """Per job, its speed on every profile of ``geom``, for the optimizer: its estimate
        where it has one (a profile's prediction, observed rates, or an estimator that needs
        no profile, such as true speeds or a profile taken at submission), else a prior (the
        catalogue average, its harmonic mean in a fixed mix) with the rates the job has shown
        so far (a job so planned is one without an estimate); then the profile's estimate plugins
        (:mod:`~miso.sched.policies.estimates`; none shipped, issue 19's experiments are in
        :mod:`miso.sched.experiments`)."""
        out, est, known = {}, self.est, not self.estimator.needs_profile
        batch: bool | None = None  # in_batch() once per call: it cannot change meanwhile
        for j in jobs:
            if known and j not in est:
                # Estimates that need no profile (true speeds, a profile taken at submission)
                # are known from the start: no prior.
                self.est[j] = self.estimator.estimate(geom, [sc.state.jobs[j]])[j]
            if j in est:  # a job that moved from another GPU model: its speeds here
                out[j] = self.est[j] = for_geometry(self.est[j], geom)
                for p in self.estimates:
                    out[j] = p.known(self, sc, j, self.est[j], out[j])
            else:
                if batch is None:
                    batch = self.in_batch(sc)
                out[j] = prior_speeds(geom, sc.state.jobs[j].spec.memory_gb, harmonic=batch)
                for p in self.estimates:
                    out[j] = p.prior(self, sc, geom, j, out[j], batch)
                seen = self.learned.get(j)
                if seen:
                    out[j] = {p: seen.get(p, v) for p, v in out[j].items()}
        return out

    # -- planning ---------------------------------------------------------------------------
    def replan(self, now: float, g: str, sc: Scratch, force_solve: bool = False) -> None:
        if not self.plannable(g, sc):
            return
        self.rebalancer.changed(g)  # estimates of its jobs may change
        jobs = sc.jobs_on(g)
        if not jobs:
            return
        if sc.cycle.trigger == "arrival" and self.clock.gap is None and \
                not any(j in self.ran for j in jobs):
            # No arrival rate yet (the first jobs, or a batch submitted at once): plan at the
            # end of this instant, when every job submitted with it is placed, so no job
            # starts only to be restarted by the next one of the batch.
            self.dirty.add(g)
            self.wake_once(sc.out, now, "batch")
            return
        j = jobs[0]
        st = sc.state
        if len(jobs) == 1 and self.estimator.needs_profile and j not in self.est \
                and j not in self.ran and st.jobs[j].spec.checkpointable \
                and self.admission.profile_pays(sc, j):
            # A newcomer alone on g: profiled there, since it pays and nobody else stops.
            levels = tuple(self.opts.profile_levels)
            sc.out.append(StartProfiling(
                g, st.new_plan_id(), (j,), levels=levels, seconds_per_level=self.profile_s,
                why={"trigger": sc.cycle.trigger, "note": f"{j} is new and alone on {g}: "
                     f"profiled alone ({len(levels)} MPS levels) so its MIG "
                     f"speeds are known before it ever shares a GPU; no other job stops"}))
            self.last_profile[g] = now
            return
        self.solve_and_apply(now, g, jobs, self.speeds(st.gpus[g].geom, sc, jobs), sc)

    def solve_and_apply(self, now: float, g: str, jobs: list[str], speeds: Speeds,
                        sc: Scratch) -> None:
        """Plan ``g`` for ``jobs``: the optimizer's layout with restarts priced (economy),
        room kept for expected arrivals where free (:meth:`keep_room`), explained."""
        gs = sc.state.gpus[g]
        speeds = sc.entitled_speeds(g, speeds)
        current = {j: pl for j, pl in gs.assignment.items() if j in speeds}
        pinned = (self.pinned(sc, jobs) | self.bursts.landed(sc, g)) & set(current)  # (burst)
        horizon, penalty = self.economy.prices(sc, jobs, speeds, current)
        objective = self.objective if horizon is None else "restart-aware"
        solve = partial(optimizer_for(gs.geom).try_solve, current=current, objective=objective,
                        restart_penalty=penalty, pinned=pinned)
        sol = solve(speeds)
        if sol is None:
            free = [j for j in jobs if j not in pinned]  # a newcomer first
            for j in ([j for j in free if j not in current] or free)[-1:]:
                sc.requeue(j, "no layout holds the mix", cause=RequeueCause.NO_LAYOUT)
            return
        sol, assignment, reserved = self.keep_room(sc, g, jobs, speeds, sol, solve)
        lay = tuple(sorted(sol.layout))
        if lay == tuple(sorted(gs.layout)) and assignment == gs.assignment:
            declined_plan(self, sc, g, speeds, current, pinned, (horizon, penalty), reserved)
            return
        why = self.plan_why(g, jobs, speeds, current, assignment, sol.objective, pinned,
                            horizon, reserved, sc.cycle.trigger)
        sc.out.append(ApplyLayout(g, sc.state.new_plan_id(), lay, assignment, why=why))

    def keep_room(self, sc: Scratch, g: str, jobs: list[str], speeds: Speeds, sol: Any,
                  solve: Any) -> tuple[Any, dict[str, Any], str | None]:
        """(solution, assignment of the real jobs, the instances kept free or None): in a
        burst the landing slots stay free; else the headroom for the next arrival, only
        where it restarts nobody more (never restart a job for an arrival that may not
        come)."""
        burst = self.bursts.burst(sc)  # (asked once: nothing between changes its inputs)
        ghosts = self.bursts.landing_slots(sc, g, jobs) if burst else {}  # slots for the next
        ghost = None if burst else self.economy.headroom(sc, g, jobs)
        plain = sol, dict(sol.assignment), None
        if ghost is None and not ghosts:
            return plain
        ghosts = ghosts or {_NEXT: ghost}
        alt = solve({**speeds, **ghosts})
        if alt is None or ghost is not None and not (  # no room kept, or none that pays
                set(alt.restarted) <= set(sol.restarted) and headroom_pays(
                    jobs, speeds, sol.assignment, alt.assignment,  # sched/reservecost.py
                    self.clock.gap * len(sc.state.gpus), self.restarts.cost)):
            return plain
        reserved = ", ".join(str(alt.assignment[x]) for x in ghosts)
        return alt, {j: pl for j, pl in alt.assignment.items() if j not in ghosts}, reserved

    def estimates_why(self, jobs: list[str], speeds: Speeds) -> dict[str, Any]:
        """What a plan's explanation says of its jobs' speeds: the speeds planned with, their
        std and interval where the estimator knows them, the jobs planned with the prior (those
        without an estimate: :meth:`speeds` gave them the prior in this call)."""
        unc = self.estimator.uncertainty
        intervals = getattr(self.estimator, "interval", {})  # none without a predictor
        return {
            "speeds": {j: dict(speeds[j]) for j in jobs},
            "std": {j: dict(unc.get(j, {})) for j in jobs if j in unc},
            "interval": {j: dict(intervals[j]) for j in jobs if j in intervals},
            "prior": sorted(j for j in jobs if j not in self.est),
        }

    def plan_why(self, g: str, jobs: list[str], speeds: Speeds, current: dict[str, Any],
                 assignment: dict[str, Any], objective: float, pinned: set[str],
                 horizon: float | None, reserved: str | None, trigger: str) -> dict[str, Any]:
        """A plan's explanation: speeds and their uncertainty, throughput before and after,
        the restarts with the price each was charged (the one the plan was chosen with)."""
        thr = sum(speeds[j][pl.profile] for j, pl in assignment.items())
        cur_thr = sum(speeds[j][pl.profile] for j, pl in current.items() if pl.profile in speeds[j])
        restarted = [j for j in current if assignment.get(j) != current[j]]
        costs = {j: self.restarts.cost(j) for j in restarted}  # what the plan priced them at
        note = explain_plan(g, thr, cur_thr if current else None, restarted, horizon, costs)
        if reserved is not None:
            note += f"; {reserved} kept free for the next arrival (expected within the horizon)"
        return {
            "trigger": trigger,
            **self.estimates_why(jobs, speeds),
            "objective": objective, "throughput": thr,
            "current_objective": cur_thr if current else None,
            "restarts": restarted, "pinned": sorted(pinned),
            "expected_gain": thr - cur_thr, "horizon_s": horizon,
            "reserved": reserved,
            "restart_costs": costs,
            "note": note,
        }

    def on_capacity(self, now: float, sc: Scratch) -> None:
        """Place the first ``BACKFILL_WINDOW`` queued jobs where each fits, in order, as the
        baselines do (backfill: a job that fits nowhere does not hold up the ones behind it;
        one that starves holds a GPU when it finds no room, :meth:`gpu_to_hold`); then re-plan
        the GPUs that changed."""
        jobs = sc.state.jobs
        # A job at least this large fits nowhere now (fit is monotone); per owner when
        # owners' entitlements decide which GPUs a job may join (Scratch.may_join).
        no_room: dict[str, float] = {}
        bound = sc.owner_bound()
        ahead = 0  # queued jobs passed in this pass
        held: str | None = None  # the GPU held for a starving job
        starve = self.opts.starve_after * self.work.typical() \
            if self.opts.starve_after > 0 and not self.in_batch(sc) else None
        for j in sc.queue(backfill_window(sc)):
            mem = jobs[j].spec.memory_gb
            key = jobs[j].spec.owner if bound else ""
            fits_nowhere = mem >= no_room.get(key, float("inf"))
            if not fits_nowhere:
                g, waits = self.choice.choose_gpu(j, sc, ahead, held)
                if g is not None:
                    sc.place(j, g)
                    self.dirty.add(g)
                    continue
                fits_nowhere = not waits  # no room (not a choice to wait)
                if fits_nowhere:
                    no_room[key] = mem
            ahead += 1
            # It starves: hold a GPU for the first such job that finds no room.
            if fits_nowhere and held is None and starve is not None and \
                    now - jobs[j].submitted_at > starve:
                held = self.choice.gpu_to_hold(sc, j)
        self.replan_dirty(now, sc)

    # -- events -----------------------------------------------------------------------------
    def on_applied(self, now: float, gpu: str, sc: Scratch) -> None:
        self.restarts.note_applied(sc.state, now, gpu)
        self.ran.update(sc.state.gpus[gpu].assignment)
        self.ran.update(sc.state.gpus[gpu].mps_shares)
        super().on_applied(now, gpu, sc)

    def on_finish(self, now: float, job: str, gpu: str | None, sc: Scratch) -> None:
        for d in (self.ref_rate, self.base_est, self.learned):  # (independent records)
            d.pop(job, None)
        self.ran.discard(job)
        for x in (*self.estimates, self.restarts, self.work):
            x.forget(job)
        super().on_finish(now, job, gpu, sc)
        self.rebalancer.fill_idle_gpus(now, sc)

MisoPlus.__init__.__signature__ = records_signature(RECORDS, "miso")  # type: ignore[attr-defined]
_NEXT = "\x00next-arrival"   # the phantom newcomer of :meth:`MisoPlus.headroom`
