"""ClusterState: the bookkeeping both drivers keep identically, and policies read.

Drivers call :meth:`ClusterState.observe` with every event *before* handing it to the policy,
and :meth:`ClusterState.apply` with every decision the policy returns, in order, *before*
executing it. ``apply`` validates the decision (valid layout, resident jobs, memory, at most one
instance per job) and raises :class:`ContractError` when a policy breaks the contract. The only
change a policy makes itself is drawing plan ids with :meth:`ClusterState.new_plan_id`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from miso.jobstatus import JobStatus
from miso.mig import Geometry, Placement, geometry, violations
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
from miso.sched.events import (
    Event,
    GangFailed,
    GangStarted,
    GpuAdded,
    GpuRemoved,
    JobCheckpointable,
    JobFailed,
    JobFinished,
    JobProgress,
    JobSpec,
    JobStopped,
    JobSubmitted,
    LayoutApplied,
    LayoutFailed,
    ProfilingFinished,
    SpeedObserved,
)
from miso.sched.gangstate import GangBook
from miso.sched.queueorder import fifo_key
from miso.sched.services import SERVICE_EVENTS, DrainReplica, StartReplica
from miso.sched.servicestate import ServiceBook
from miso.sched.tenancy import Tenancy
from miso.sched.tenancyconfig import TenancyConfig


class ContractError(RuntimeError):
    """A decision that breaks the scheduling contract (a policy bug)."""


class Phase(StrEnum):
    """What a GPU is doing."""

    IDLE = "idle"                    # no pending plan and nothing running
    PROFILING = "profiling"          # MPS profiling of its mix (or waiting for a layout after it)
    RECONFIGURING = "reconfiguring"  # a layout / MPS plan is being applied
    RUNNING = "running"              # the last plan is applied, jobs run


@dataclass
class JobState:
    """One job as the scheduler knows it."""

    spec: JobSpec
    submitted_at: float
    status: JobStatus = JobStatus.QUEUED
    gpu: str | None = None
    placement: Placement | None = None        # current MIG instance (None under MPS / not running)
    restarts: int = 0                         # checkpoint-restarts caused by decisions
    mps_profile: tuple[float, ...] | None = None   # raw rates of the last profiling run
    profiled_with: tuple[str, ...] = ()       # the mix of that run (column order)
    observed: dict[str, float] = field(default_factory=dict)  # profile -> first raw rate seen
    finished_at: float | None = None
    #: last progress report folded in (:class:`~miso.sched.events.JobProgress`):
    #: (time, work left in full-GPU seconds, full-GPU seconds done per second)
    progress: tuple[float, float, float] | None = None

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def queue_key(self) -> tuple[bool, float, str]:
        """Its place in the queue: jobs ``ahead`` first, then submission order
        (:func:`miso.sched.queueorder.fifo_key`)."""
        return fifo_key(self)

    def remaining_work(self, now: float) -> float | None:
        """Work left at ``now`` in seconds alone on a full GPU, extrapolated from the last
        progress report; None when the job never reported progress or has ended."""
        p = self.progress
        if p is None or self.status is JobStatus.FINISHED or self.status is JobStatus.FAILED:
            return None
        t, work, rate = p
        left = work - (rate * (now - t) if rate > 0 else 0.0)
        return max(0.0, left)


@dataclass
class GpuState:
    """One GPU: geometry, resident jobs, applied and pending plans."""

    id: str
    geom: Geometry
    jobs: list[str] = field(default_factory=list)            # resident jobs, placement order
    phase: Phase = Phase.IDLE
    layout: tuple[Placement, ...] = ()                       # applied MIG layout
    assignment: dict[str, Placement] = field(default_factory=dict)   # applied, running jobs
    mps_shares: dict[str, int] = field(default_factory=dict)  # applied MPS shares (MPS mode)
    pending: Decision | None = None                          # plan issued, not acknowledged
    applied_plan_id: int = 0
    #: the whole GPU's geometry while service replicas hold some of its slices (``geom`` is
    #: then what they leave free: :mod:`miso.sched.servicestate`); None: no replica
    base: Geometry | None = None

    @property
    def model(self) -> str:
        return self.geom.model.name

    @property
    def pending_plan_id(self) -> int | None:
        return getattr(self.pending, "plan_id", None)

    @property
    def busy(self) -> bool:
        """A plan is in flight (profiling or reconfiguring)."""
        return self.pending is not None

    def target_assignment(self) -> dict[str, Placement]:
        """The assignment being applied (pending ``ApplyLayout``) or else the applied one,
        restricted to resident jobs."""
        src = self.pending.assignment if isinstance(self.pending, ApplyLayout) \
            else self.assignment
        return {j: pl for j, pl in src.items() if j in self.jobs}

    def free_instances(self) -> list[Placement]:
        """Instances of the applied layout that hold no job."""
        used = set(self.assignment.values())
        return [pl for pl in self.layout if pl not in used]


class ClusterState:
    """GPUs, jobs and the queue; updated by drivers from events and decisions."""

    def __init__(self, tenancy: TenancyConfig | None = None) -> None:
        self.gpus: dict[str, GpuState] = {}
        self.jobs: dict[str, JobState] = {}
        #: queued job ids, FIFO (submission order; the head's replica jobs first:
        #: :attr:`JobState.queue_key`)
        self.queue: list[str] = []
        self._plan = 0
        self.now = 0.0
        self._watchers: list[Callable[[str], None]] = []
        #: whole-GPU runs (gangs), held GPUs and the gang queue (:mod:`miso.sched.gangstate`)
        self.gangs = GangBook(self)
        self._progress_watchers: list[Callable[[str], None]] = []
        #: owners' usage, fair-share order and quotas (:mod:`miso.sched.tenancy`); None: FIFO
        self.tenancy: Tenancy | None = Tenancy(tenancy, self) if tenancy is not None else None
        #: inference services and their replicas' slices (:mod:`miso.sched.servicestate`)
        self.services = ServiceBook(self)
        #: The driver's hint while it delivers several submissions of one instant
        #: (:meth:`miso.sched.driver.DriverStep.arrivals`): how many are still to come after
        #: the one being decided (a policy leaves its placement pass to the last), and how
        #: many the batch holds (that pass looks as many more jobs down the queue). 0 and 1
        #: for an event delivered alone.
        self.more_arrivals = 0
        self.batch_arrivals = 1
        #: The live driver's hint while it delivers the events waiting in its queue as one
        #: group (:meth:`miso.sched.driver.DriverStep.group`): a policy leaves its placement
        #: pass to the group's end and notes here the event it owes the pass for
        #: (``BasePolicy.capacity``). The simulator never sets it.
        self.defer_capacity = False
        self.capacity_owed: object | None = None

    def watch(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(gpu)`` after every change to a GPU's resident jobs, plans, layout or
        assignment, and when it is added or removed (policies keep indexes with it)."""
        self._watchers.append(fn)

    def notify(self, g: str | None) -> None:
        """Tell the watchers that ``g`` changed (the gang book's changes)."""
        self._changed(g)

    def check_plan(self, gs: GpuState, pid: int) -> None:
        """ContractError unless ``pid`` is a new plan id for ``gs``."""
        self._check_plan(gs, pid)

    def requeue_resident(self, j: str) -> None:
        """Put a job whose GPU left back in the queue (submission order)."""
        self._to_queue(j)

    def watch_progress(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(job)`` after a progress report is folded into a job's state (a policy
        that learns from reports looks at those jobs only)."""
        self._progress_watchers.append(fn)

    def _changed(self, g: str | None) -> None:
        if g is not None:
            for fn in self._watchers:
                fn(g)

    # -- policy helpers --------------------------------------------------------------------
    def new_plan_id(self) -> int:
        """Next cluster-wide plan id (strictly increasing)."""
        self._plan += 1
        return self._plan

    @property
    def last_plan_id(self) -> int:
        return self._plan

    def active_jobs(self) -> list[str]:
        return [j for j, s in self.jobs.items()
                if s.status not in (JobStatus.FINISHED, JobStatus.FAILED)]

    def memory_used(self, gpu: str) -> float:
        return sum(self.jobs[j].spec.memory_gb for j in self.gpus[gpu].jobs)

    # -- events ----------------------------------------------------------------------------
    def observe(self, now: float, event: Event) -> None:
        """Update from an event (driver calls this before ``policy.decide``)."""
        self.now = now
        match event:
            case JobProgress() | JobCheckpointable() | SpeedObserved():
                self._job_fact(now, event)
            case JobSubmitted(job=spec):
                self._submitted(now, spec)
            case GpuAdded(gpu=g, model=m, profiles=p, driver=d):
                if g in self.gpus or g in self.gangs.gpus:
                    raise ContractError(f"GPU {g} added twice")
                self.gpus[g] = GpuState(g, geometry(m, p, d))
                self._changed(g)
            case GpuRemoved(gpu=g) if g in self.gangs.gpus:
                self.gangs.lost(g)
            case GpuRemoved(gpu=g):
                self.services.gpu_removed(g)
                gs = self.gpus.pop(g)
                for j in gs.jobs:
                    self._to_queue(j)
                self._changed(g)
            case JobStopped(job=j):
                self._requeue(j)
            case JobFinished(job=j) | JobFailed(job=j):
                self._ended(now, j, JobStatus.FINISHED if isinstance(event, JobFinished)
                            else JobStatus.FAILED)
            case ProfilingFinished() | LayoutApplied() | LayoutFailed():
                self._plan_ended(event)
            case GangStarted() | GangFailed():
                self.gangs.observe(now, event)
            case _ if isinstance(event, SERVICE_EVENTS):
                self.services.observe(now, event)
            case _:
                pass

    def _plan_ended(self, event: Event) -> None:
        """A GPU's plan ended: profiled, applied or failed (a stale plan id is ignored)."""
        match event:
            case ProfilingFinished(gpu=g, plan_id=pid, speeds=sp):
                gs = self.gpus.get(g)
                if gs is None or gs.pending_plan_id != pid:
                    return  # stale
                mix = tuple(sp)
                for j, v in sp.items():
                    if j in self.jobs:
                        self.jobs[j].mps_profile = tuple(v)
                        self.jobs[j].profiled_with = mix
                gs.pending = None
                gs.applied_plan_id = pid
                gs.phase = Phase.PROFILING if gs.jobs else Phase.IDLE
                self._changed(g)
            case LayoutApplied(gpu=g, plan_id=pid):
                gs = self.gpus.get(g)
                if gs is None or gs.pending_plan_id != pid:
                    return  # stale or superseded
                self._ack(gs)
            case LayoutFailed(gpu=g, plan_id=pid):
                gs = self.gpus.get(g)
                if gs is None or gs.pending_plan_id != pid:
                    return
                gs.pending = None
                gs.layout = ()
                gs.assignment = {}
                gs.mps_shares = {}
                gs.phase = Phase.IDLE
                for j in gs.jobs:
                    self.jobs[j].status = JobStatus.PLACED
                    self.jobs[j].placement = None
                self._changed(g)

    def _job_fact(self, now: float, event: Event) -> None:
        """What a job reported: its progress, whether it checkpoints, a speed seen."""
        match event:
            case JobProgress(job=j, work_s=w, rate=r):
                js = self.jobs.get(j)
                if js is not None:
                    js.progress = (now, w, r)
                    for fn in self._progress_watchers:
                        fn(j)
            case JobCheckpointable(job=j, checkpointable=c):
                if j in self.jobs and self.jobs[j].spec.checkpointable is not c:
                    self.jobs[j].spec = replace(self.jobs[j].spec, checkpointable=c)
            case SpeedObserved(job=j, placement=pl, rate=r):
                if j in self.jobs:
                    self.jobs[j].observed.setdefault(pl.profile, r)

    def _submitted(self, now: float, spec: JobSpec) -> None:
        """A new job: queued (a gang in the gang book's queue)."""
        if spec.id in self.jobs:
            raise ContractError(f"job {spec.id} submitted twice")
        js = self.jobs[spec.id] = JobState(spec, now)
        if spec.duration_hint_s is not None:
            js.progress = (now, spec.duration_hint_s, 0.0)
        if spec.gang:
            self.gangs.submitted(js)
        elif spec.ahead:  # behind the other jobs ahead, before every other queued job
            i = next((k for k, j in enumerate(self.queue) if not self.jobs[j].spec.ahead),
                     len(self.queue))
            self.queue.insert(i, spec.id)
        else:
            self.queue.append(spec.id)
        if self.tenancy is not None:
            self.tenancy.note_owner(spec.owner)

    def _ended(self, now: float, j: str, status: JobStatus) -> None:
        """Job ``j`` ended (finished or failed): off its GPU (or GPUs) or out of the queue."""
        js = self.jobs[j]
        js.status = status
        js.finished_at = now
        held = self.gangs.gpus.get(js.gpu) if js.gpu is not None else None
        if self.gangs.ended(js):
            pass
        elif js.gpu is not None and (js.gpu in self.gpus or held is not None):
            gs = self.gpus.get(js.gpu) or held
            assert gs is not None
            gs.jobs.remove(j)
            gs.assignment.pop(j, None)
            gs.mps_shares.pop(j, None)
            if not gs.jobs and gs.pending is None:
                gs.phase = Phase.IDLE
            self._changed(gs.id)
        elif j in self.queue:
            self.queue.remove(j)
        js.placement = None  # js.gpu keeps the last GPU (policies read it)

    def _requeue(self, j: str) -> None:
        """A checked RequeueJob: ``j`` off its GPU, back in the queue."""
        js = self._job(j)
        if js.gpu is None:
            raise ContractError(f"RequeueJob {j}: job is not on a GPU")
        gs = self.gpus[js.gpu]
        if js.status is JobStatus.RUNNING:
            js.restarts += 1
        gs.jobs.remove(j)
        gs.assignment.pop(j, None)
        gs.mps_shares.pop(j, None)
        self._to_queue(j)
        self._changed(gs.id)

    def _ack(self, gs: GpuState) -> None:
        d = gs.pending
        gs.pending = None
        assert d is not None
        gs.applied_plan_id = d.plan_id  # type: ignore[attr-defined]
        if isinstance(d, ApplyLayout):
            gs.layout = tuple(sorted(d.layout))
            gs.assignment = {j: pl for j, pl in d.assignment.items() if j in gs.jobs}
            gs.mps_shares = {}
            for j, pl in gs.assignment.items():
                self.jobs[j].status = JobStatus.RUNNING
                self.jobs[j].placement = pl
        elif isinstance(d, RunMps):
            gs.layout = (Placement(0, gs.geom.model.full_profile().name),)
            gs.assignment = {}
            gs.mps_shares = {j: s for j, s in d.shares.items() if j in gs.jobs}
            for j in gs.mps_shares:
                self.jobs[j].status = JobStatus.RUNNING
                self.jobs[j].placement = None
        gs.phase = Phase.RUNNING if gs.jobs else Phase.IDLE
        self._changed(gs.id)

    def _to_queue(self, j: str) -> None:
        js = self.jobs[j]
        js.gpu = None
        js.placement = None
        js.status = JobStatus.QUEUED
        # Keep the queue in submission order (jobs ahead first).
        self.queue.append(j)
        self.queue.sort(key=lambda x: self.jobs[x].queue_key)

    # -- decisions -------------------------------------------------------------------------
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
                self._changed(g)
            case ApplyLayout():
                self._apply_layout(d)
            case RunMps():
                self._run_mps(d)
            case RequeueJob(job=j):
                self._requeue(j)
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
        self._changed(g)

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
        self._changed(g)

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
        self._changed(g)

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
        if pid > self._plan:
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
