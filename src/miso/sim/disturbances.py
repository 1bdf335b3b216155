"""What happens to simulated jobs from outside the scheduler: a mixin of
:class:`~miso.sim.engine.Simulator`.

* phase changes (``WorldConfig.phase_change_prob``): a job switches to another workload's speeds
  mid-run (drivers report it as ``JobSpeedChanged`` past their threshold);
* outside events (:meth:`Disturbances.inject`): a job failing or cancelled, a GPU lost.
"""

from __future__ import annotations

from typing import Any

from miso.sched import GpuRemoved, JobFailed, JobSpeedChanged
from miso.sched.speeds import workload_speeds
from miso.sim.bodies import EXTERNAL, SimGpu, SimJob
from miso.workloads import catalogue


class Disturbances:
    """Phase changes and outside events (it uses the simulator's ``gpus``, ``jobs``,
    ``state``, ``cfg``, ``geom`` and its ``push``/``stop_job``/``set_rate``/``touch``/
    ``target_rate``/``refresh_mps``/``deliver``/``state_gpu``); a gang stops on every GPU."""

    gpus: dict[str, SimGpu]
    jobs: dict[str, SimJob]
    state: Any
    cfg: Any
    geom: Any
    state_gpu: Any

    def alternatives(self) -> dict[str, list[str]]:
        cat = catalogue()
        out = {}
        for w in cat:
            have = set(workload_speeds(self.geom, cat[w]))
            out[w] = [o for o in cat if o != w and have <= set(workload_speeds(self.geom, cat[o]))]
        return out

    def inject(self, at: float, ev: JobFailed | GpuRemoved) -> None:
        """Schedule an outside event: a job failing or cancelled (``JobFailed``; it ends
        then, its JCT counts to that time) or a GPU lost (``GpuRemoved``; its jobs stop and
        return to the queue, a job that cannot checkpoint losing its progress when it is
        restarted). The sim/live parity test feeds both drivers such a stream."""
        if not isinstance(ev, JobFailed | GpuRemoved):
            raise TypeError(f"cannot inject {type(ev).__name__}")
        self.push(at, EXTERNAL, ev)

    def outside_event(self, now: float, ev: JobFailed | GpuRemoved) -> None:
        if isinstance(ev, JobFailed):
            j = self.jobs.get(ev.job)
            if j is None or j.finish is not None:
                return
            self.stop_job(j, now)
            j.finish = now
            gid = self.state.jobs[j.id].gpu if j.id in self.state.jobs else None
            held = self.state.gangs.gpus
            g = self.gpus[gid] if gid is not None and (gid in self.state.gpus or gid in held) \
                else None
            ranks = [self.gpus[x] for x in self.state.gangs.runs.get(j.id, ())[1:]]
            in_mps = False
            for r in ranks:
                self.touch(r, now)
                r.mig_asg.pop(j.id, None)
            if g is not None:
                self.touch(g, now)
                g.mig_asg.pop(j.id, None)
                in_mps = g.mps.pop(j.id, None) is not None
            self.deliver(now, ev)
            for r in ranks:
                r.busy = bool(self.state_gpu(r.id).jobs)
            if g is not None:
                g.busy = bool(self.state_gpu(g.id).jobs)
                if in_mps:
                    self.refresh_mps(g, now)
            return
        g = self.gpus.get(ev.gpu)
        if g is None or (ev.gpu not in self.state.gpus and ev.gpu not in self.state.gangs.gpus):
            return
        self.touch(g, now)
        others: list = []
        for jid in self.state_gpu(g.id).jobs:
            j = self.jobs[jid]
            self.stop_job(j, now)
            j.mode = None
            j.placement = None
            for x in self.state.gangs.runs.get(jid, ()):  # a gang stops on every GPU
                if x != g.id:
                    self.touch(self.gpus[x], now)
                    self.gpus[x].mig_asg.pop(jid, None)
                    others.append(self.gpus[x])
        g.mig_asg = {}
        g.mps = {}
        g.mode = "gone"
        g.plan = -1      # acks of its plans in flight never come
        g.busy = False
        self.deliver(now, ev)
        for r in others:
            r.busy = bool(self.state_gpu(r.id).jobs)

    def phase_change(self, now: float, jid: str, version: int) -> None:
        j = self.jobs[jid]
        if version != j.version or j.finish is None and j.alt is None:
            return
        if j.finish is not None or j.alt is None:
            return
        old = j.rate
        j.truth = workload_speeds(self.geom, catalogue()[j.alt])
        j.workload = j.alt
        j.alt = None
        j.milestone = None
        gid = self.state.jobs[jid].gpu
        if gid is None or j.waiting or old <= 0:
            return
        g = self.gpus[gid]
        self.set_rate(j, now, self.target_rate(j, g))
        if old > 0 and abs(j.rate / old - 1.0) > self.cfg.speed_report_threshold:
            self.deliver(now, JobSpeedChanged(jid, gid, j.rate * j.base_rate,
                                               old * j.base_rate))
