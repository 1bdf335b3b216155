"""How the simulated world moves: a mixin of :class:`~miso.sim.engine.Simulator` with the
job physics (rates and progress, stops, restarts and their cost, resumes, completions, MPS
shares) and the execution of the core's decisions in the simulated cluster (layouts with
their transition plans, MPS shares, requeues, timers). The engine keeps the clock and the
driver loop; see :mod:`miso.sim.engine` for the restart-cost model.
"""

from __future__ import annotations

from typing import Any

from miso.mig import Placement, canonical, plan_transition
from miso.mps_speed import mps_speed
from miso.sched import (
    ApplyLayout,
    Decision,
    JobFinished,
    JobProgress,
    PlaceJob,
    RequeueCause,
    RequeueJob,
    RunMps,
    SpeedObserved,
    StartProfiling,
    WakeUp,
)
from miso.sim.bodies import COMPLETE, PHASE, PLAN_DONE, RESUME, TICK, SimGpu, SimJob


class SimExecution:
    """Job physics and decision execution of the simulator (it uses the simulator's
    ``gpus``, ``jobs``, ``state``, ``cfg``, ``geom``, ``step``, its counters of preemptions
    and reclaims, and its ``push``/``deliver``/``touch``/``state_gpu``/``start_profiling``)."""

    gpus: dict[str, SimGpu]
    jobs: dict[str, SimJob]
    state: Any
    cfg: Any
    geom: Any
    step: Any
    preemptions: int
    preempt_lost_gpu_s: float
    reclaims: int
    reclaim_lost_gpu_s: float
    reclaim_events: int
    reclaims_useless: int
    reclaimed_for: dict[str, float]
    push: Any
    deliver: Any
    touch: Any
    state_gpu: Any
    start_profiling: Any

    # -- job physics --------------------------------------------------------------------------
    def set_rate(self, j: SimJob, now: float, rate: float) -> None:
        if j.rate > 0:
            j.work_left -= j.rate * (now - j.t_last)
            if j.work_left < 0:
                j.work_left = 0.0
        j.t_last = now
        j.rate = rate
        j.version += 1
        if j.ckpt:
            # what a job using the ``miso.job`` helper reports; one that cannot checkpoint
            # has no helper and reports nothing
            self.step.fold(now, JobProgress(j.id, j.work_left, rate))
        if rate > 0:
            self.push(now + j.work_left / rate, COMPLETE, j.id, j.version)
            if j.milestone is not None and j.work_left > j.milestone:
                self.push(now + (j.work_left - j.milestone) / rate, PHASE, j.id, j.version)

    def stop_job(self, j: SimJob, now: float) -> None:
        self.set_rate(j, now, 0.0)
        j.token += 1
        j.waiting = False

    def restart(self, j: SimJob, share: float) -> float:
        """Account one restart of a job that has made progress; returns its wait (s): the
        job's own restart cost (``restart_s``, or drawn around it with ``restart_spread``)."""
        cost = j.restart_cost
        j.restarts += 1
        j.lost += cost * share
        if not j.ckpt:
            j.lost += j.duration - j.work_left
            j.work_left = j.duration
        return cost

    def _share(self, pl: Placement | None, geom: Any = None) -> float:
        geom = geom or self.geom
        if pl is None:
            return 1.0
        return geom.model.profile(pl.profile).compute_slices / \
            geom.model.full_profile().compute_slices

    def _schedule_resume(self, j: SimJob, at: float) -> None:
        j.token += 1
        j.waiting = True
        self.push(at, RESUME, j.id, j.token)

    def target_rate(self, j: SimJob, g: SimGpu) -> float:
        if j.factors is not None:  # several GPU models: speeds relative to the first model
            if j.mode == "whole":  # a gang runs at its slowest rank's speed
                ranks = self.state.gangs.runs.get(j.id) or (g.id,)
                return min(j.factors[self.gpus[x].model] for x in ranks)
            return self._rate_on(j, g) * (1.0 if j.mode == "mig" else j.factors[g.model])
        return self._rate_on(j, g)

    def _rate_on(self, j: SimJob, g: SimGpu) -> float:
        if j.mode == "mig":
            assert j.placement is not None
            truth = j.truth if j.truths is None else j.truths[g.model]
            s = truth.get(j.placement.profile)
            if s is None:  # cannot happen with validated decisions; be conservative
                s = min(truth.values())
            return s
        if j.mode == "mps":
            return mps_speed(j.workload, g.mps[j.id], len(g.mps), self.cfg.mps_penalty)
        if j.mode == "whole":
            return 1.0
        if j.mode == "prof":
            sp = g.prof_speeds.get(j.id)
            if not sp:
                return 0.0
            return sp[100]  # the run ends at 100 % (profiling_run_order)
        return 0.0

    def _resume(self, now: float, jid: str, token: int) -> None:
        j = self.jobs[jid]
        if token != j.token or j.finish is not None or not j.waiting:
            return
        j.waiting = False
        gid = self.state.jobs[jid].gpu
        if gid is None:
            return
        g = self.gpus[gid]
        j.started = True
        if j.first_start is None:
            j.first_start = now
        self.set_rate(j, now, self.target_rate(j, g))
        if j.mode == "mig" and self.cfg.observe_speeds and j.placement is not None:
            self.deliver(now, SpeedObserved(jid, gid, j.placement, j.rate * j.base_rate))

    def _finish(self, now: float, j: SimJob) -> None:
        j.work_left = 0.0
        j.rate = 0.0
        j.finish = now
        gid = self.state.jobs[j.id].gpu
        g = self.gpus[gid] if gid is not None else None
        ranks = self.state.gangs.runs.get(j.id, ())
        for x in ranks[1:]:
            self.touch(self.gpus[x], now)
            self.gpus[x].mig_asg.pop(j.id, None)
        if g is not None:
            self.touch(g, now)
            g.mig_asg.pop(j.id, None)
            in_mps = g.mps.pop(j.id, None) is not None
        self.deliver(now, JobFinished(j.id))
        for x in ranks[1:]:
            self.gpus[x].busy = bool(self.state_gpu(x).jobs)
        if g is not None:
            g.busy = bool(self.state_gpu(g.id).jobs)
            if in_mps:
                self.refresh_mps(g, now)

    def refresh_mps(self, g: SimGpu, now: float) -> None:
        for jid in g.mps:
            j = self.jobs[jid]
            if j.mode == "mps" and not j.waiting and j.finish is None:
                self.set_rate(j, now, self.target_rate(j, g))

    # -- decisions ----------------------------------------------------------------------------
    def judge_reclaims(self, assignment: dict, geom: object) -> None:
        """A job a reclaim was for, now given a slice: the reclaim was useless when that slice
        is no larger than the job's packed share (what packing gave it anyway)."""
        for jid, pl in assignment.items():
            packed = self.reclaimed_for.pop(jid, None)
            if packed is not None and self._share(pl, geom) <= packed + 1e-9:
                self.reclaims_useless += 1

    def _exec(self, now: float, d: Decision, gid: str | None = None) -> None:
        cfg = self.cfg
        if isinstance(d, PlaceJob):
            return
        if isinstance(d, ApplyLayout):
            g = self.gpus[d.gpu]
            resident = set(self.state.gpus[d.gpu].jobs)
            cur = {j: pl for j, pl in g.mig_asg.items() if j in resident} \
                if g.mode == "mig" else {}
            cur_layout = g.layout if g.mode == "mig" else (g.full,)
            plan = plan_transition(g.geom, cur_layout, cur, d.layout, d.assignment)
            if self.reclaimed_for:
                self.judge_reclaims(d.assignment, g.geom)
            reconf = cfg.reconfig_s if (plan.destroy or plan.create) else 0.0
            keep_mps = None
            if g.mode == "prof" and len(d.assignment) == 1:
                (jid, pl), = d.assignment.items()
                j = self.jobs[jid]
                if pl == g.full and j.mode == "prof" and not j.waiting and j.rate > 0:
                    keep_mps = jid  # alone, already at 100 % of the full GPU: keeps running
            for jid, pl in plan.start:
                j = self.jobs[jid]
                if jid == keep_mps:
                    j.mode = "mig"
                    j.placement = pl
                    self.set_rate(j, now, self.target_rate(j, g))
                    continue
                self.stop_job(j, now)
                j.mode = "mig"
                j.placement = pl
                wait = self.restart(j, self._share(pl, g.geom)) if j.started else 0.0
                self._schedule_resume(j, now + reconf + wait)
            g.layout = canonical(d.layout)
            g.mig_asg = dict(d.assignment)
            g.mode = "mig"
            g.mps = {}
            g.plan = d.plan_id
            self.push(now + reconf, PLAN_DONE, g.id, d.plan_id)
        elif isinstance(d, StartProfiling):
            self.start_profiling(now, d)
        elif isinstance(d, RunMps):
            g = self.gpus[d.gpu]
            old = g.mps if g.mode == "mps" else {}
            g.mode = "mps"
            g.layout = (g.full,)
            g.mig_asg = {}
            g.mps = dict(d.shares)
            g.plan = d.plan_id
            for jid, share in d.shares.items():
                j = self.jobs[jid]
                if old.get(jid) != share or j.mode != "mps":
                    self.stop_job(j, now)
                    j.mode = "mps"
                    j.placement = None
                    wait = self.restart(j, share / 100.0) if j.started else 0.0
                    self._schedule_resume(j, now + wait)
            self.refresh_mps(g, now)
            self.push(now, PLAN_DONE, g.id, d.plan_id)
        elif isinstance(d, RequeueJob):
            j = self.jobs[d.job]
            share = self._share(j.placement, self.gpus[gid].geom if gid is not None else None) \
                if j.mode == "mig" else 1.0
            self.stop_job(j, now)
            if d.cause in (RequeueCause.PREEMPTED, RequeueCause.RECLAIMED) and j.started:
                # what the restart this preemption (priority) or reclaim (fair share) causes
                # throws away (see ``restart``)
                lost = self.cfg.restart_s * share + (0.0 if j.ckpt else j.duration - j.work_left)
                if d.cause is RequeueCause.PREEMPTED:
                    self.preemptions += 1
                    self.preempt_lost_gpu_s += lost
                else:
                    self.reclaims += 1
                    self.reclaim_lost_gpu_s += lost
            why = d.why or {}
            if d.cause is RequeueCause.RECLAIMED and "for_job" in why:
                if why["for_job"] not in self.reclaimed_for:
                    self.reclaim_events += 1
                self.reclaimed_for[str(why["for_job"])] = float(why["packed_share"])
            j.mode = None
            j.placement = None
            # The job's GPU before the requeue (``gid``): no scan over every GPU.
            for g in [self.gpus[gid]] if gid is not None else self.gpus.values():
                g.mig_asg.pop(d.job, None)
                if g.mps.pop(d.job, None) is not None:
                    self.refresh_mps(g, now)
        elif isinstance(d, WakeUp):
            self.push(max(now, d.at), TICK, d.tag)
