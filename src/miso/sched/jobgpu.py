"""One job and one GPU as the scheduler knows them (:class:`JobState`, :class:`GpuState` and
a GPU's :class:`Phase`): the records :class:`~miso.sched.state.ClusterState` holds and
policies read."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from miso.jobstatus import JobStatus
from miso.mig import Geometry, Placement
from miso.sched.decisions import ApplyLayout, Decision
from miso.sched.events import JobSpec
from miso.sched.queueorder import fifo_key


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
