"""ClusterState: the bookkeeping both drivers keep identically, and policies read.

Drivers call :meth:`ClusterState.observe` with every event *before* handing it to the policy,
and :meth:`ClusterState.apply` with every decision the policy returns, in order, *before*
executing it. ``apply`` validates the decision (valid layout, resident jobs, memory, at most one
instance per job) and raises :class:`ContractError` when a policy breaks the contract. The only
change a policy makes itself is drawing plan ids with :meth:`ClusterState.new_plan_id`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from miso.jobstatus import JobStatus
from miso.mig import Placement, geometry
from miso.sched.decisions import ApplyLayout, RunMps
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
from miso.sched.jobgpu import GpuState, JobState, Phase
from miso.sched.services import SERVICE_EVENTS
from miso.sched.servicestate import ServiceBook
from miso.sched.stateapply import ContractError, DecisionApplier
from miso.sched.tenancy import Tenancy
from miso.sched.tenancyconfig import TenancyConfig

#: Names other modules import from here (their homes: :mod:`miso.sched.jobgpu`,
#: :mod:`miso.sched.stateapply`, :mod:`miso.jobstatus`).
__all__ = ["ClusterState", "ContractError", "GpuState", "JobState", "JobStatus", "Phase"]


class ClusterState(DecisionApplier):
    """GPUs, jobs and the queue; updated by drivers from events (here) and decisions
    (:meth:`apply`, :class:`~miso.sched.stateapply.DecisionApplier`)."""

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
        """Tell the watchers that ``g`` changed (the gang book's changes, the applied
        decisions)."""
        if g is not None:
            for fn in self._watchers:
                fn(g)

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
                self.notify(g)
            case GpuRemoved(gpu=g) if g in self.gangs.gpus:
                self.gangs.lost(g)
            case GpuRemoved(gpu=g):
                self.services.gpu_removed(g)
                gs = self.gpus.pop(g)
                for j in gs.jobs:
                    self._to_queue(j)
                self.notify(g)
            case JobStopped(job=j):
                self.requeue_checked(j)
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
                self.notify(g)
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
                self.notify(g)

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
            self.notify(gs.id)
        elif j in self.queue:
            self.queue.remove(j)
        js.placement = None  # js.gpu keeps the last GPU (policies read it)

    def requeue_checked(self, j: str) -> None:
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
        self.notify(gs.id)

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
        self.notify(gs.id)

    def _to_queue(self, j: str) -> None:
        js = self.jobs[j]
        js.gpu = None
        js.placement = None
        js.status = JobStatus.QUEUED
        # Keep the queue in submission order (jobs ahead first).
        self.queue.append(j)
        self.queue.sort(key=lambda x: self.jobs[x].queue_key)
