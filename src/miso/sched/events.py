"""Events: what a driver (simulator or live controller) tells a policy.

Plain frozen dataclasses, no behaviour. Times are seconds (the driver's clock), speeds are raw
rates in any per-job unit (iterations/s, samples/s) unless a field says "relative"; GPU and job
ids are strings chosen by the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from miso.mig import Placement

#: MPS active-thread percentages of a profiling run, in the order speeds are reported.
MPS_LEVELS: tuple[int, ...] = (100, 50, 14)


def profiling_run_order(levels: tuple[int, ...]) -> tuple[int, ...]:
    """The order drivers run a profiling run's levels in: as given, with 100 % last (added if
    missing), so the jobs keep running at 100 % afterwards without one more switch (each level
    is a new process: a thread percentage is fixed per process)."""
    return tuple(lv for lv in levels if lv != 100) + (100,)


@dataclass(frozen=True)
class JobSpec:
    """A submitted training job.

    ``memory_gb`` is the job's peak GPU memory (GB); a slice with less memory cannot hold it.
    ``workload`` names a catalogue workload (:func:`miso.workloads.catalogue`) when it is known
    (simulation, emulated runs); only ground-truth estimators may read it.
    ``duration_hint_s`` is an optional estimate of the run time alone on a full GPU (the
    job's remaining work until it reports progress, :class:`JobProgress`).
    ``checkpointable`` is False for a job that cannot save and resume its progress (no
    ``miso.job`` helper): a restart throws all its progress away, so restart-economy policies
    pin it once it has made progress.
    ``owner`` is the tenant the job is charged to (the API user; "" when tenancy is not used)
    and ``priority`` its class (:data:`miso.sched.tenancyconfig.PRIORITY_CLASSES`: high 100,
    normal 0, low -100, or any integer); both are read only when tenancy is on
    (:mod:`miso.sched.tenancy`).
    ``num_gpus`` > 1 makes the job a gang: it runs on that many whole GPUs at once, all its
    processes started, checkpointed and restarted together (:mod:`miso.sched.gangs`);
    ``nodes`` optionally spreads it over that many nodes (None: as few as fit).
    ``gpu_model`` optionally pins the job to one GPU model (None: any).
    ``profile`` optionally pins the job to one MIG profile (``3g.20gb``; None: the policy
    chooses; :func:`miso.sched.pinning.pinned_speeds`). ``after``: jobs that must end first
    (:mod:`miso.sched.dependencies`).
    ``ahead`` queues the job ahead of every job without it (FIFO among those with it): the
    head's own service replicas (:mod:`miso.controller.servicescale`), so that a training job
    checkpointed to make room for a replica does not take its room back; set by the head
    only, never through the API.
    """

    id: str
    name: str
    memory_gb: float
    workload: str | None = None
    duration_hint_s: float | None = None
    checkpointable: bool = True
    owner: str = ""
    priority: int = 0
    num_gpus: int = 1
    nodes: int | None = None
    gpu_model: str | None = None
    profile: str | None = None
    after: tuple[str, ...] = ()
    ahead: bool = False

    @property
    def gang(self) -> bool:
        """The job asks for more than one GPU."""
        return self.num_gpus > 1


@dataclass(frozen=True)
class Event:
    """Base class of all events."""


@dataclass(frozen=True)
class JobSubmitted(Event):
    """A job entered the system (it is queued until a policy places it)."""

    job: JobSpec


@dataclass(frozen=True)
class ProfilingFinished(Event):
    """An MPS profiling run (decision :class:`~miso.sched.decisions.StartProfiling`) ended.

    ``speeds[job]`` are the job's raw rates at each level of ``levels`` (same order), measured
    with all the profiled jobs running together under MPS on the full slice. The jobs keep
    running under MPS (100 %) until the policy applies a layout.
    """

    gpu: str
    plan_id: int
    speeds: Mapping[str, tuple[float, ...]]
    levels: tuple[int, ...] = MPS_LEVELS


@dataclass(frozen=True)
class LayoutApplied(Event):
    """The GPU now has the layout (or MPS shares) of plan ``plan_id``; its jobs run there."""

    gpu: str
    plan_id: int


@dataclass(frozen=True)
class LayoutFailed(Event):
    """Plan ``plan_id`` could not be applied (or a profiling run could not start).

    The GPU is left with no instances and its jobs checkpointed but still resident on it (the
    policy decides: retry, other layout or requeue).
    """

    gpu: str
    plan_id: int
    reason: str


@dataclass(frozen=True)
class JobFinished(Event):
    """The job completed; its instance stays in the layout, idle."""

    job: str


@dataclass(frozen=True)
class JobFailed(Event):
    """The job crashed or was killed; it leaves the system like a finished job."""

    job: str
    reason: str


@dataclass(frozen=True)
class JobStopped(Event):
    """A rule outside the policy stopped the job on ``gpu`` after a checkpoint and put it back
    in the queue (the operator's requeue at a time limit, issue 26): it resumes from its
    checkpoint when placed again; its GPU has room, as after a job's end."""

    job: str
    gpu: str
    reason: str = ""


@dataclass(frozen=True)
class JobCheckpointable(Event):
    """The driver learned whether a job can checkpoint (the ``miso.job`` helper announces it;
    a job that never does cannot). ``ClusterState`` updates the job's spec."""

    job: str
    checkpointable: bool


@dataclass(frozen=True)
class JobProgress(Event):
    """How much work a job has left, as of the event's time, in ONE unit for every driver:
    seconds alone on a full GPU (``work_s``), shrinking at ``rate`` full-GPU seconds per second
    (the relative speed of the slice it runs on; 0 while it does not run).

    The simulator knows both exactly. The live controller converts a job's own progress report
    (iterations left, iterations/s on its current slice) with the slice's relative speed:
    ``work_s = iterations_left / rate_on_slice * speed_of_slice``
    (:func:`miso.sched.progress.full_gpu_work`). Drivers fold it into
    :class:`~miso.sched.state.JobState` (:meth:`~miso.sched.state.JobState.remaining_work`)
    without calling ``decide``: progress moves continuously, it is not a decision point. A job
    that never reports progress (it cannot checkpoint: no ``miso.job`` helper) has no
    remaining work known.
    """

    job: str
    work_s: float
    rate: float = 0.0


@dataclass(frozen=True)
class SpeedObserved(Event):
    """First steady raw rate of a job on a MIG instance (once per job and placement run).

    Lets policies learn true MIG speeds: a rate on the full profile gives the job's reference
    rate, rates on other profiles divided by it give relative speeds.
    """

    job: str
    gpu: str
    placement: Placement
    rate: float


@dataclass(frozen=True)
class JobSpeedChanged(Event):
    """The job's observed rate departs from ``baseline``, the rate first seen on its slice.

    Drivers emit it when ``|observed / baseline - 1|`` exceeds their report threshold (the
    policy applies its own threshold and cool-down on top).
    """

    job: str
    gpu: str
    observed: float
    baseline: float


@dataclass(frozen=True)
class GpuAdded(Event):
    """A GPU joined (at start-up every GPU is announced this way).

    ``model`` is a :mod:`miso.mig` model name; ``profiles``/``driver`` restrict the geometry
    (None = the model's default profiles, current driver).
    """

    gpu: str
    model: str
    profiles: tuple[str, ...] | None = None
    driver: int | None = None


@dataclass(frozen=True)
class GpuRemoved(Event):
    """The GPU left; its resident jobs are back in the queue (checkpointed)."""

    gpu: str


@dataclass(frozen=True)
class GangStarted(Event):
    """Every process of a whole-GPU run (decision :class:`~miso.sched.decisions.StartGang`
    of plan ``plan_id``) started: the job runs on all its GPUs."""

    job: str
    plan_id: int


@dataclass(frozen=True)
class GangFailed(Event):
    """A whole-GPU run could not start on every GPU; none of its processes runs (the ones
    that started were stopped) and the job is back in the queue."""

    job: str
    plan_id: int
    reason: str


@dataclass(frozen=True)
class Tick(Event):
    """A timer fired (requested with :class:`~miso.sched.decisions.WakeUp`)."""

    tag: str = ""

