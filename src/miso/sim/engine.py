"""Discrete-event simulator: drives a scheduling policy against a simulated MIG cluster.

The engine is a driver of :mod:`miso.sched` exactly like the live controller: it owns a
:class:`~miso.sched.ClusterState`, delivers events one at a time (``observe`` -> ``decide`` ->
``apply`` each decision -> execute it), and acknowledges plans with the same events. The world
(true speeds, overheads) is private to the engine.

Restart cost (honest): a job that has made progress and is started again (a repartition moves
it, a requeue, MPS profiling stops it, and *every MPS level switch*, since the active-thread
percentage is fixed per process) waits ``restart_s`` with no progress (checkpoint, process
start, CUDA and data-loader warm-up, restore); with ``restart_spread`` each job has its own
cost, drawn around ``restart_s`` (the policy is told only ``restart_s``). A job that cannot
checkpoint (``no_checkpoint_frac``) also loses all its progress. ``lost_gpu_s`` adds up the GPU
time thrown away: the restart wait times the share of the GPU the job holds, plus discarded
progress (in full-GPU seconds). A profiling run takes its levels in the decision's order with
the 100 % level last, so the jobs keep running under MPS at 100 % afterwards (no further
switch); a job alone on its GPU that then gets the full slice keeps running (no restart).
``profiling_gpu_s`` is the GPU time spent in MPS profiling runs (from the decision to the
report).

Efficiency: a binary-heap event queue with a sequence tie-break; each job's progress is updated
only when its own rate changes (rate x elapsed time), with version numbers invalidating stale
completion events; the optimizer is cached per geometry (:func:`miso.optimize.optimizer_for`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from miso.mig import geometry
from miso.sched import (
    ClusterState,
    ContractError,
    Decision,
    Event,
    GpuAdded,
    JobFinished,
    JobSpec,
    JobSubmitted,
    LayoutApplied,
    PlaceJob,
    Policy,
    RequeueJob,
    Tick,
)
from miso.sched.clock import VirtualClock
from miso.sched.decisions import StartGang, StopGang
from miso.sched.driver import DriverStep, batchable
from miso.sched.events import GangStarted
from miso.sched.gangs import GangLayer, with_gangs
from miso.sched.modelspeed import model_factor
from miso.sched.speeds import workload_memory_gb, workload_speeds
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.bodies import (
    ARRIVE,
    COMPLETE,
    EXTERNAL,
    GANG_UP,
    PHASE,
    PLAN_DONE,
    PROF_DONE,
    PROF_RUN,
    PROF_START,
    RESUME,
    TICK,
    SimGpu,
    SimJob,
)
from miso.sim.disturbances import Disturbances
from miso.sim.execution import SimExecution
from miso.sim.profiling import ProfilingRuns
from miso.sim.result import SimResult
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig
from miso.workloads import catalogue

#: GPUs per simulated node (gangs take GPUs from as few nodes as they can)
GPUS_PER_NODE = 8


class Simulator(ProfilingRuns, Disturbances, SimExecution):
    """One run of one policy over one trace."""

    def __init__(self, policy: Policy, jobs: Sequence[TraceJob], config: WorldConfig,
                 *, seed: int = 1, record: bool = False, observer: Any = None,
                 tenancy: TenancyConfig | None = None, coalesce_arrivals: bool = False) -> None:
        if any(tj.num_gpus > 1 for tj in jobs) and not isinstance(policy, GangLayer):
            # gangs beside the policy: whole-GPU FIFO with a reservation and backfill
            policy = with_gangs(policy, node_of=lambda g: str(int(g[3:]) // GPUS_PER_NODE))
        self.policy = policy
        #: arrivals at the same instant delivered as one batch (DriverStep.arrivals), as the
        #: live loop delivers the submissions waiting in its queue; off: one at a time
        self.coalesce_arrivals = coalesce_arrivals
        self.observer = observer  # miso.observe.Observer-like: on_event / on_decision
        self.cfg = config
        self.seed = seed
        self.record = record
        self.log: list[tuple[float, object]] = []
        self.state = ClusterState(tenancy)
        #: (time, {owner: GPU-equivalents in use}) at each arrival and completion (tenancy on)
        self.owner_usage: list[tuple[float, dict[str, float]]] = []
        self.preemptions = 0
        self.preempt_lost_gpu_s = 0.0
        self.reclaims = 0
        self.reclaim_lost_gpu_s = 0.0
        #: reclaims (one per job they were for) and those whose job then got no larger slice
        #: than its packed share; job -> its packed share while its new slice is awaited
        self.reclaim_events = 0
        self.reclaims_useless = 0
        self.reclaimed_for: dict[str, float] = {}
        mix = config.gpu_mix or ((config.gpu_model, config.n_gpus),)
        self.geom = geometry(mix[0][0])   # the first model: durations are on a whole one
        self.geoms = {m: geometry(m) for m, _ in mix}
        models = [m for m, k in mix for _ in range(k)]
        self.gpus = {f"gpu{i}": SimGpu(f"gpu{i}", self.geoms[m]) for i, m in enumerate(models)}
        self.multi_model = len({g.model.name for g in self.geoms.values()}) > 1
        self.clock = VirtualClock()
        self.step = DriverStep(self.state, policy, execute=self._execute, before=self._before,
                               record=self._record if record else None, observer=observer)
        cat = catalogue()
        full_mem = max(g.model.full_profile().memory_gib for g in self.geoms.values())
        self.jobs: dict[str, SimJob] = {}
        rng = np.random.default_rng([seed, 99])
        ck_rng = np.random.default_rng([seed, 7])
        self.profiling_gpu_s = 0.0
        #: GPU-seconds of GPUs holding no job while some gang waits (fragmentation)
        self.gang_idle_gpu_s = 0.0
        self._gang_idle = (0.0, 0)   # (since, idle GPUs) while a gang waits
        alts = self.alternatives() if config.phase_change_prob > 0 else {}
        for tj in jobs:
            if tj.id in self.jobs:
                raise ValueError(f"duplicate job id {tj.id} in trace")
            mem = workload_memory_gb(tj.workload)
            if tj.num_gpus > len(self.gpus):
                raise ValueError(f"job {tj.id} asks for {tj.num_gpus} GPUs; the cluster has "
                                 f"{len(self.gpus)}")
            if mem > full_mem:
                raise ValueError(f"job {tj.id}: workload {tj.workload} needs {mem:.1f} GB, more "
                                 f"than a whole {self.geom.model.name}")
            ckpt = not (config.no_checkpoint_frac > 0
                        and ck_rng.random() < config.no_checkpoint_frac)
            # A job using the ``miso.job`` helper declares its total work when it is submitted
            # and reports its progress (:class:`JobProgress`); one that cannot checkpoint has
            # no helper and reports nothing.
            spec = JobSpec(tj.id, f"job-{tj.id}", mem, tj.workload,
                           duration_hint_s=tj.duration_s if ckpt and config.declare_work else None,
                           checkpointable=ckpt,
                           owner=tj.owner, priority=tj.priority, num_gpus=tj.num_gpus,
                           profile=tj.profile, after=tuple(tj.after))
            jrng = np.random.default_rng([seed, zlib.crc32(tj.id.encode())])
            base = float(jrng.lognormal(2.0, 0.8))
            j = SimJob(tj, spec, workload_speeds(self.geom, cat[tj.workload]), base)
            j.restart_cost = config.restart_s
            if self.multi_model:
                ref = self.geom.model.name
                j.factors = {m: model_factor(tj.workload, g.model.name, ref)
                             for m, g in self.geoms.items()}
                j.truths = {m: {p: s * j.factors[m]
                                for p, s in workload_speeds(g, cat[tj.workload]).items()}
                            for m, g in self.geoms.items()}
            if config.restart_spread > 0:
                sg = config.restart_spread
                rrng = np.random.default_rng([seed, 23, zlib.crc32(tj.id.encode())])
                j.restart_cost = config.restart_s * float(rrng.lognormal(-sg * sg / 2, sg))
            if config.phase_change_prob > 0 and rng.random() < config.phase_change_prob:
                cands = alts.get(tj.workload, [])
                if cands:
                    j.alt = cands[int(rng.integers(len(cands)))]
                    j.milestone = tj.duration_s * float(rng.uniform(0.2, 0.8))
            self.jobs[tj.id] = j

    # -- clock ------------------------------------------------------------------------------
    def push(self, t: float, kind: int, a: object = None, b: object = None) -> None:
        self.clock.at(t, (kind, a, b))

    # -- driver loop --------------------------------------------------------------------------
    @property
    def n_events(self) -> int:
        return self.step.events

    @property
    def n_decisions(self) -> int:
        return self.step.decisions

    def run(self, progress: Callable[[int], None] | None = None) -> SimResult:
        import time

        t_wall = time.perf_counter()
        for g in self.gpus:
            self.deliver(0.0, GpuAdded(g, self.gpus[g].geom.model.name))
        # Arrivals enter the clock one at a time, in (time, sequence) order, each with the
        # sequence number it would have had if all were scheduled now: the same event order,
        # but the clock holds the events in flight, not the whole trace.
        js = list(self.jobs.values())
        clock = self.clock
        base = clock.reserve(len(js))
        arrivals = iter(sorted(range(len(js)), key=lambda i: (js[i].submit, i)))

        def next_arrival() -> None:
            i = next(arrivals, None)
            if i is not None:
                clock.at_seq(js[i].submit, base + i + 1, (ARRIVE, js[i].id, None))

        next_arrival()
        done = 0
        while (nxt := clock.pop()) is not None:
            t, (kind, a, b) = nxt
            if kind == COMPLETE:
                j = self.jobs[a]  # type: ignore[index]
                if b != j.version or j.finish is not None:
                    continue
                self._finish(t, j)
                done += 1
                if progress is not None and done % 50 == 0:
                    progress(done)
            elif kind == ARRIVE:
                next_arrival()
                evs = [JobSubmitted(self.jobs[a].spec)]  # type: ignore[index]
                while self.coalesce_arrivals and batchable(evs[-1]) and \
                        (nx := clock.peek()) is not None and nx[0] == t and \
                        nx[1][0] == ARRIVE and batchable(ev := JobSubmitted(
                            self.jobs[nx[1][1]].spec)):
                    clock.pop()
                    next_arrival()
                    evs.append(ev)
                if len(evs) == 1:
                    self.deliver(t, evs[0])
                else:
                    self.deliver_arrivals(t, evs)
            elif kind == RESUME:
                self._resume(t, a, b)  # type: ignore[arg-type]
            elif kind == PLAN_DONE:
                g = self.gpus[a]  # type: ignore[index]
                if g.plan == b:
                    self.deliver(t, LayoutApplied(g.id, b))  # type: ignore[arg-type]
            elif kind == PROF_START:
                self.prof_start(t, a, b)  # type: ignore[arg-type]
            elif kind == PROF_RUN:
                self.prof_run(t, a, b)  # type: ignore[arg-type]
            elif kind == PROF_DONE:
                self.prof_done(t, a, b)  # type: ignore[arg-type]
            elif kind == TICK:
                self.deliver(t, Tick(a))  # type: ignore[arg-type]
            elif kind == PHASE:
                self.phase_change(t, a, b)  # type: ignore[arg-type]
            elif kind == EXTERNAL:
                self.outside_event(t, a)  # type: ignore[arg-type]
            elif kind == GANG_UP:
                self.deliver(t, GangStarted(a, b))  # type: ignore[arg-type]
        if progress is not None:
            progress(done)
        self.note_gang_idle(self.clock_now_end())
        if self.step.errors:
            raise ContractError(f"{len(self.step.errors)} decisions broke the contract "
                                f"(first: {self.step.errors[0]})")
        unfinished = [j.id for j in self.jobs.values() if j.finish is None]
        if unfinished:
            raise RuntimeError(f"{len(unfinished)} jobs never finished under "
                               f"{self.policy.name} (first: {unfinished[:5]})")
        end = max(j.finish for j in self.jobs.values())  # type: ignore[type-var]
        for g in self.gpus.values():
            self.touch(g, end)
        ids = list(self.jobs)
        js = [self.jobs[i] for i in ids]
        ten = self.state.tenancy
        if ten is not None:
            ten.advance(end)
        return SimResult(
            policy=self.policy.name, job_ids=ids,
            submit=np.array([j.submit for j in js]), finish=np.array([j.finish for j in js]),
            duration=np.array([j.duration for j in js]),
            restarts=np.array([self.jobs[i].restarts for i in ids]),
            busy_gpu_s=sum(g.busy_total for g in self.gpus.values()), n_gpus=len(self.gpus),
            events=self.n_events, decisions=self.n_decisions,
            wall_s=time.perf_counter() - t_wall, log=self.log,
            lost_gpu_s=float(sum(j.lost for j in js)), profiling_gpu_s=self.profiling_gpu_s,
            owners=[j.spec.owner for j in js], priority=np.array([j.spec.priority for j in js]),
            first_start=np.array([j.first_start if j.first_start is not None else j.finish
                                  for j in js]),
            owner_gpu_s=dict(ten.total) if ten is not None else {},
            owner_usage=self.owner_usage, preemptions=self.preemptions,
            preempt_lost_gpu_s=self.preempt_lost_gpu_s, reclaims=self.reclaims,
            reclaim_lost_gpu_s=self.reclaim_lost_gpu_s, reclaim_events=self.reclaim_events,
            reclaims_useless=self.reclaims_useless + len(self.reclaimed_for),
            num_gpus=np.array([j.spec.num_gpus for j in js]),
            gang_idle_gpu_s=self.gang_idle_gpu_s)

    def deliver(self, now: float, ev: Event) -> None:
        """One driver step (:class:`~miso.sched.driver.DriverStep`) for ``ev``."""
        self.step(now, ev)
        if self.state.gangs.queue or self._gang_idle[1]:
            self.note_gang_idle(now)
        ten = self.state.tenancy
        if ten is not None and isinstance(ev, JobSubmitted | JobFinished):
            self.owner_usage.append((now, {o: c for o, c in ten.in_use.items() if c > 0}))

    def deliver_arrivals(self, now: float, evs: list[JobSubmitted]) -> None:
        """Several arrivals of one instant as one batch (``coalesce_arrivals``)."""
        self.step.arrivals(now, evs)
        if self.state.gangs.queue or self._gang_idle[1]:
            self.note_gang_idle(now)
        ten = self.state.tenancy
        if ten is not None:
            self.owner_usage.append((now, {o: c for o, c in ten.in_use.items() if c > 0}))

    def clock_now_end(self) -> float:
        return max((j.finish for j in self.jobs.values() if j.finish is not None), default=0.0)

    def note_gang_idle(self, now: float) -> None:
        """Integrate the GPUs holding no job while a gang waits, up to ``now``."""
        t0, idle = self._gang_idle
        if idle and now > t0:
            self.gang_idle_gpu_s += idle * (now - t0)
        st = self.state
        n = 0
        if st.gangs.queue:
            n = sum(1 for gs in st.gpus.values() if not gs.jobs) + \
                sum(1 for gs in st.gangs.gpus.values() if not gs.jobs)
        self._gang_idle = (now, n)

    def state_gpu(self, gid: str) -> Any:
        """The core's record of GPU ``gid``, in the policies' view or held for a gang."""
        st = self.state
        return st.gpus.get(gid) or st.gangs.gpus[gid]

    def _record(self, now: float, item: object) -> None:
        self.log.append((now, item))

    def _before(self, now: float, d: Decision) -> Any:
        if isinstance(d, StartGang | StopGang):
            gids = d.gpus if isinstance(d, StartGang) else self.state.gangs.runs.get(d.job, ())
            for g in gids:
                self.touch(self.gpus[g], now)
            return tuple(gids)
        gid = self._gpu_of(d)
        if gid is not None:
            self.touch(self.gpus[gid], now)
        return gid

    def _execute(self, now: float, d: Decision, gid: Any) -> None:
        if isinstance(gid, tuple):
            self.exec_gang(now, d, gid)
            for g in gid:
                self.gpus[g].busy = bool(self.state_gpu(g).jobs)
            return
        self._exec(now, d, gid)
        if gid is not None:
            self.gpus[gid].busy = bool(self.state_gpu(gid).jobs)

    def exec_gang(self, now: float, d: Decision, gids: tuple[str, ...]) -> None:
        """Carry out a whole-GPU run's start or stop on all its GPUs together."""
        if isinstance(d, StartGang):
            j = self.jobs[d.job]
            reconf = 0.0
            for g in (self.gpus[x] for x in gids):
                if g.layout != (g.full,) or g.mode != "mig":
                    reconf = self.cfg.reconfig_s
                g.layout = (g.full,)
                g.mode = "mig"
                g.mps = {}
                g.mig_asg = {d.job: g.full}
                g.plan = d.plan_id
            self.stop_job(j, now)
            j.mode = "whole"
            j.placement = self.gpus[gids[0]].full
            wait = self.restart(j, float(len(gids))) if j.started else 0.0
            self._schedule_resume(j, now + reconf + wait)
            self.push(now + reconf, GANG_UP, d.job, d.plan_id)
        elif isinstance(d, StopGang):
            j = self.jobs[d.job]
            self.stop_job(j, now)
            j.mode = None
            j.placement = None
            for g in gids:
                self.gpus[g].mig_asg.pop(d.job, None)

    def _gpu_of(self, d: Decision) -> str | None:
        if isinstance(d, PlaceJob):
            return d.gpu
        if isinstance(d, RequeueJob):
            return self.state.jobs[d.job].gpu
        return None

    def touch(self, g: SimGpu, now: float) -> None:
        if g.busy:
            g.busy_total += now - g.busy_t
        g.busy_t = now
