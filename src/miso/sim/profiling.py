"""MPS profiling runs in the simulator: a mixin of :class:`~miso.sim.engine.Simulator`.

A run takes its levels in the decision's order with the 100 % level last (each level is a new
process: a restart for a job that has run before), measures the jobs' speeds at every level
(the one MPS speed model, :mod:`miso.mps_speed`; with measurement noise for
``predictor="unet"``, whose U-Net reads them), and reports ``ProfilingFinished``; the jobs
keep running at 100 %.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from miso.mps_speed import PROFILE_LEVELS, measured_profile, mix_speeds
from miso.sched import ProfilingFinished, StartProfiling
from miso.sched.events import profiling_run_order
from miso.sim.bodies import PROF_DONE, PROF_RUN, PROF_START, SimGpu


class ProfilingRuns:
    """The profiling part of the simulator (it uses the simulator's ``gpus``, ``jobs``,
    ``state``, ``cfg``, ``seed`` and its ``push``/``stop_job``/``set_rate``/``restart``/
    ``deliver``)."""

    gpus: dict[str, SimGpu]
    jobs: dict[str, Any]
    state: Any
    cfg: Any
    seed: int
    profiling_gpu_s: float

    def start_profiling(self, now: float, d: StartProfiling) -> None:
        """Carry out ``d``: the GPU goes to MPS (a reconfiguration unless it already is one
        full instance), its jobs stop, and level 0 begins after the reconfiguration."""
        cfg = self.cfg
        g = self.gpus[d.gpu]
        reconf = cfg.reconfig_s if (g.mode != "mig" or g.layout != (g.full,)) else 0.0
        if g.mode == "prof":
            reconf = 0.0
        for jid in d.jobs:
            j = self.jobs[jid]
            self.stop_job(j, now)
            j.mode = "prof"
            j.placement = None
        g.layout = (g.full,)
        g.mig_asg = {}
        g.mps = {}
        g.mode = "prof"
        g.plan = d.plan_id
        g.prof_jobs = list(d.jobs)
        g.prof_speeds = {}
        g.prof_t0 = now
        g.prof_s = d.seconds_per_level
        g.prof_levels = profiling_run_order(d.levels)
        self.push(now + reconf, PROF_START, g.id, (d.plan_id, 0, d.levels))

    def prof_jobs(self, g: SimGpu) -> list[str]:
        resident = set(self.state.gpus[g.id].jobs)
        return [j for j in g.prof_jobs if j in resident and self.jobs[j].finish is None]

    def prof_start(self, now: float, gid: str, info: tuple[int, int, tuple[int, ...]]) -> None:
        """Level ``k`` of a profiling run begins: every job starts a new process at the level
        (a restart for a job that has run before), then runs for ``seconds_per_level``."""
        pid, k, levels = info
        g = self.gpus[gid]
        if g.plan != pid or g.mode != "prof":
            return
        jobs = self.prof_jobs(g)
        g.prof_jobs = jobs
        if k == 0 and jobs:
            wls = [self.jobs[j].workload for j in jobs]
            if self.cfg.predictor in ("unet", "predictor"):
                # the U-Net reads these: measured, so with measurement noise
                m = measured_profile(wls, np.random.default_rng([self.seed, pid]),
                                     penalty=self.cfg.mps_penalty)
                sp = [tuple(float(m[PROFILE_LEVELS.index(lv), i]) for lv in g.prof_levels)
                      for i in range(len(wls))]
            else:
                sp = mix_speeds(wls, g.prof_levels, self.cfg.mps_penalty)
            # Every level run has a speed (the run order adds 100 % when it is not asked for).
            g.prof_speeds = {j: dict(zip(g.prof_levels, row, strict=True))
                             for j, row in zip(jobs, sp, strict=True)}
        wait = 0.0
        for jid in jobs:
            j = self.jobs[jid]
            if j.rate > 0:
                self.set_rate(j, now, 0.0)
            if j.started:
                wait = max(wait, self.restart(j, 1.0 / len(jobs)))
        self.push(now + wait, PROF_RUN, gid, info)

    def prof_run(self, now: float, gid: str, info: tuple[int, int, tuple[int, ...]]) -> None:
        pid, k, levels = info
        g = self.gpus[gid]
        if g.plan != pid or g.mode != "prof":
            return
        level = g.prof_levels[k]
        for jid in self.prof_jobs(g):
            j = self.jobs[jid]
            j.started = True
            if j.first_start is None:
                j.first_start = now
            self.set_rate(j, now, float(g.prof_speeds[jid][level]))
        nxt = now + g.prof_s
        if k + 1 < len(g.prof_levels):
            self.push(nxt, PROF_START, gid, (pid, k + 1, levels))
        else:
            self.push(nxt, PROF_DONE, gid, (pid, levels))

    def prof_done(self, now: float, gid: str, info: tuple[int, tuple[int, ...]]) -> None:
        pid, levels = info
        g = self.gpus[gid]
        if g.plan != pid or g.mode != "prof":
            return
        self.profiling_gpu_s += now - g.prof_t0
        speeds = {}
        jobs = self.prof_jobs(g)
        for jid in jobs:
            j = self.jobs[jid]
            sp = g.prof_speeds[jid]
            speeds[jid] = tuple(sp[lv] * j.base_rate for lv in levels)
            # it keeps running at the last level, 100 % (its rate is already set)
        self.deliver(now, ProfilingFinished(gid, pid, speeds, levels))
