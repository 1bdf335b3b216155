"""Recording a policy's decisions in :class:`~miso.sched.state.ClusterState`:
:meth:`DecisionApplier.apply` checks each decision against the scheduling contract (a valid
layout, resident jobs, memory, increasing plan ids) and raises :class:`ContractError` when a
policy breaks it, then records it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from miso.jobstatus import JobStatus
from miso.mig import Placement, violations
from miso.sched.decisions import (
    ApplyLayout,
    Decision,
    HoldGpu,
    PlaceJob,
    ReleaseGpu,
    RepartitionDeclined,
    RequeueJob,
    RunMps,
    StartGang,
    StartProfiling,
    StopGang,
    WakeUp,
)
from miso.sched.jobgpu import GpuState, JobState, Phase
from miso.sched.services import DrainReplica, StartReplica

if TYPE_CHECKING:
    from miso.sched.gangstate import GangBook
    from miso.sched.servicestate import ServiceBook


class ContractError(RuntimeError):
    """A decision that breaks the scheduling contract (a policy bug)."""


class DecisionApplier:
    """The decision half of :class:`~miso.sched.state.ClusterState` (its base): ``apply`` and
    its checks. Reads the state's GPUs, jobs and queue, the gang and service books, and its
    plan counter; changes reach the watchers through ``notify``."""

    gpus: dict[str, GpuState]
    jobs: dict[str, JobState]
    queue: list[str]
    now: float
    gangs: GangBook
    services: ServiceBook

    if TYPE_CHECKING:
        @property
        def last_plan_id(self) -> int: ...
        def notify(self, g: str | None) -> None: ...
        def requeue_checked(self, j: str) -> None: ...
        def memory_used(self, gpu: str) -> float: ...

    def _check_layout(self, g: str, gs: GpuState, pid: int, lay: tuple[Placement, ...],
                      asg: dict[str, Placement]) -> None:
        """An ApplyLayout's layout valid on ``g`` and its assignment one instance per resident
        job, each within its instance's memory."""
        probs = violations(gs.geom, lay)
        if probs:
            raise ContractError(f"ApplyLayout plan {pid} on {g}: invalid layout: "
                                + "; ".join(probs))
        if set(asg) != set(gs.jobs):
            raise ContractError(f"ApplyLayout plan {pid} on {g}: assignment covers "
                                f"{sorted(asg)}, resident jobs are {sorted(gs.jobs)}")
        if len(set(asg.values())) != len(asg):
            raise ContractError(f"ApplyLayout plan {pid} on {g}: two jobs share an "
                                f"instance")
        lay_set = set(lay)
        for j, pl in asg.items():
            if pl not in lay_set:
                raise ContractError(f"ApplyLayout plan {pid} on {g}: {j} on {pl}, not "
                                    f"in the layout")
            mem = gs.geom.model.profile(pl.profile).memory_gib
            if self.jobs[j].spec.memory_gb > mem + 1e-9:
                raise ContractError(f"ApplyLayout plan {pid} on {g}: {j} needs "
                                    f"{self.jobs[j].spec.memory_gb:.1f} GB, {pl} has "
                                    f"{mem} GiB")

    def apply(self, now: float, d: Decision) -> None:
        """Validate and record a decision (driver calls this before executing it)."""
        self.now = now
        match d:
            case PlaceJob(job=j, gpu=g):
                self._place(j, g)
            case StartProfiling(gpu=g, plan_id=pid, jobs=jobs):
                gs = self._gpu(g)
                self._check_plan(gs, pid)
                if sorted(jobs) != sorted(gs.jobs):
                    raise ContractError(f"StartProfiling on {g}: jobs {sorted(jobs)} are not the "
                                        f"resident jobs {sorted(gs.jobs)}")
                self._stop_running(gs)
                # beside service replicas the jobs are profiled in the free slices
                gs.layout = () if gs.base is not None else (
                    Placement(0, gs.geom.model.full_profile().name),)
                gs.pending = d
                gs.phase = Phase.PROFILING
                self.notify(g)
            case ApplyLayout():
                self._apply_layout(d)
            case RunMps():
                self._run_mps(d)
            case RequeueJob(job=j):
                self.requeue_checked(j)
            case WakeUp() | RepartitionDeclined():
                pass
            case HoldGpu(gpu=g) if self.services.by_gpu.get(g):
                raise ContractError(f"HoldGpu {g}: service replicas hold slices of it")
            case HoldGpu() | ReleaseGpu() | StartGang() | StopGang():
                self.gangs.apply(d)
            case StartReplica() | DrainReplica():
                self.services.apply(now, d)
            case _:
                raise ContractError(f"unknown decision {d!r}")

    def _place(self, j: str, g: str) -> None:
        """A checked PlaceJob: queued ``j`` onto ``g`` within its instance count and memory."""
        js = self._job(j)
        gs = self._gpu(g)
        if js.status is not JobStatus.QUEUED:
            raise ContractError(f"PlaceJob {j}: job is {js.status}, not queued")
        cap = gs.geom.model.max_instances
        if len(gs.jobs) >= cap:
            raise ContractError(f"PlaceJob {j} on {g}: GPU already holds {cap} jobs")
        mem = gs.geom.model.full_profile().memory_gib
        if self.memory_used(g) + js.spec.memory_gb > mem + 1e-9:
            raise ContractError(f"PlaceJob {j} on {g}: memory {js.spec.memory_gb:.1f} GB "
                                f"over the GPU's {mem} GiB with resident jobs")
        self.queue.remove(j)
        gs.jobs.append(j)
        js.gpu = g
        js.status = JobStatus.PLACED
        self.notify(g)

    def _apply_layout(self, d: ApplyLayout) -> None:
        """A checked ApplyLayout: jobs whose instance changes stop (a running one restarts)."""
        g, pid, lay, asg = d.gpu, d.plan_id, d.layout, d.assignment
        gs = self._gpu(g)
        self._check_plan(gs, pid)
        self._check_layout(g, gs, pid, lay, asg)
        for j, pl in asg.items():
            js = self.jobs[j]
            if js.placement != pl or js.status is not JobStatus.RUNNING:
                if js.status is JobStatus.RUNNING:
                    js.restarts += 1
                js.status = JobStatus.PLACED
                js.placement = None
        gs.pending = d
        gs.phase = Phase.RECONFIGURING
        self.notify(g)

    def _run_mps(self, d: RunMps) -> None:
        """A checked RunMps: jobs whose share changes stop (a running one restarts)."""
        g, pid, shares = d.gpu, d.plan_id, d.shares
        gs = self._gpu(g)
        self._check_plan(gs, pid)
        if set(shares) != set(gs.jobs):
            raise ContractError(f"RunMps plan {pid} on {g}: shares cover {sorted(shares)}"
                                f", resident jobs are {sorted(gs.jobs)}")
        for j in shares:
            js = self.jobs[j]
            if js.status is not JobStatus.RUNNING or gs.mps_shares.get(j) != shares[j]:
                if js.status is JobStatus.RUNNING:
                    js.restarts += 1
                js.status = JobStatus.PLACED
        gs.pending = d
        gs.phase = Phase.RECONFIGURING
        self.notify(g)

    def _stop_running(self, gs: GpuState) -> None:
        for j in gs.jobs:
            js = self.jobs[j]
            if js.status is JobStatus.RUNNING:
                js.restarts += 1
            js.status = JobStatus.PLACED
            js.placement = None
        gs.assignment = {}
        gs.mps_shares = {}

    def _check_plan(self, gs: GpuState, pid: int) -> None:
        if pid <= gs.applied_plan_id or (gs.pending_plan_id is not None
                                         and pid <= gs.pending_plan_id):
            raise ContractError(f"plan id {pid} on {gs.id} does not increase")
        if pid > self.last_plan_id:
            raise ContractError(f"plan id {pid} was not drawn with new_plan_id()")

    def _job(self, j: str) -> JobState:
        try:
            return self.jobs[j]
        except KeyError:
            raise ContractError(f"unknown job {j}") from None

    def _gpu(self, g: str) -> GpuState:
        try:
            return self.gpus[g]
        except KeyError:
            raise ContractError(f"unknown GPU {g}") from None
