"""Decisions: what a policy asks a driver to do. Plain frozen dataclasses.

Explanations: ``ApplyLayout``, ``StartProfiling`` and ``RequeueJob`` carry an optional ``why``
(not part of equality), filled by the policies that optimise: ``trigger`` (arrival, completion,
profiled, speed_change, node_change, rebalance, ...), ``speeds`` {job: {profile: predicted
speed}}, ``std`` {job: {profile: std}} when known, ``objective`` (of the chosen plan),
``current_objective`` (of the current layout for the same jobs, or None), ``restarts`` (jobs the
plan restarts), ``expected_gain`` and ``note`` (words). Drivers log it; nothing depends on it.

Plan ids come from :meth:`miso.sched.state.ClusterState.new_plan_id` (a cluster-wide monotone
counter); acknowledgements carry them back (:class:`~miso.sched.events.LayoutApplied`,
:class:`~miso.sched.events.LayoutFailed`, :class:`~miso.sched.events.ProfilingFinished`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from miso.mig import Placement
from miso.sched.events import MPS_LEVELS


@dataclass(frozen=True)
class Decision:
    """Base class of all decisions."""


@dataclass(frozen=True)
class PlaceJob(Decision):
    """Move a queued job onto ``gpu`` (bookkeeping only: it runs once a later
    :class:`ApplyLayout`, :class:`StartProfiling` or :class:`RunMps` on that GPU includes it)."""

    job: str
    gpu: str
    #: with tenancy: ``order``, what priority or fair share changed in the order (words)
    why: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class StartProfiling(Decision):
    """Profile the mix ``jobs`` (all jobs resident on ``gpu``) under MPS.

    The driver checkpoints the jobs, sets the GPU to its full profile, starts the jobs together
    under MPS and measures each job's rate for ``seconds_per_level`` at each active-thread level
    of ``levels``; then it reports :class:`~miso.sched.events.ProfilingFinished`.
    """

    gpu: str
    plan_id: int
    jobs: tuple[str, ...]
    levels: tuple[int, ...] = MPS_LEVELS
    seconds_per_level: float = 10.0
    why: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class ApplyLayout(Decision):
    """Give ``gpu`` the MIG ``layout`` and run each job of ``assignment`` on its instance.

    ``assignment`` covers exactly the jobs resident on the GPU. Jobs whose instance is kept keep
    running; the others are checkpointed and restarted (see :func:`miso.mig.plan_transition`).
    """

    gpu: str
    plan_id: int
    layout: tuple[Placement, ...]
    assignment: Mapping[str, Placement]
    why: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class RunMps(Decision):
    """Run the resident jobs of ``gpu`` together under MPS on the full slice, each limited to
    ``shares[job]`` percent of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). MPS-only policy."""

    gpu: str
    plan_id: int
    shares: Mapping[str, int]


class RequeueCause(StrEnum):
    """Why a job goes back to the queue, as data (``RequeueJob.reason`` says it in words):
    drivers and observers read this, never the words."""

    LAYOUT_FAILED = "layout_failed"   # its GPU's plan failed
    PREEMPTED = "preempted"           # for a higher-priority job (tenancy's preemption)
    RECLAIMED = "reclaimed"           # fair share returned its room to another owner
    NO_LAYOUT = "no_layout"           # no layout of its GPU holds the mix
    REBALANCE = "rebalance"           # it moves onto an idle GPU
    OTHER = "other"


@dataclass(frozen=True)
class RequeueJob(Decision):
    """Checkpoint the job, take it off its GPU and put it back in the queue."""

    job: str
    reason: str = ""
    cause: RequeueCause = RequeueCause.OTHER
    why: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class RepartitionDeclined(Decision):
    """A record, not an action: the policy kept ``gpu``'s layout where a repartition would
    have raised its total speed, because the restarts it needed cost more. ``restarts``: the
    running jobs the declined plan would have restarted; ``gain``: what it would have won,
    ``price``: what its restarts cost, in the same unit (``why["unit"]``: ``speed``, total
    speed over the plan's horizon, or ``s``, summed completion time); ``job``: a queued job
    that waits because of it ("" when the plan concerned only the GPU's residents). Drivers
    log it and execute nothing; the state ignores it; it is not counted as a decision."""

    gpu: str
    restarts: tuple[str, ...]
    gain: float
    price: float
    job: str = ""
    why: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class WakeUp(Decision):
    """Deliver a :class:`~miso.sched.events.Tick` with ``tag`` at time ``at`` (s)."""

    at: float
    tag: str = ""


@dataclass(frozen=True)
class HoldGpu(Decision):
    """Take ``gpu`` out of the policies' view for the gang layer (:mod:`miso.sched.gangs`):
    no new job is placed on it; its resident jobs run to their end (draining) and it is kept
    for ``job``'s whole-GPU run (a reservation)."""

    gpu: str
    job: str = ""


@dataclass(frozen=True)
class ReleaseGpu(Decision):
    """Give a held GPU (:class:`HoldGpu`) back to the policies' view."""

    gpu: str


@dataclass(frozen=True)
class StartGang(Decision):
    """Start ``job`` on the whole held GPUs ``gpus`` together, all or none (one process per
    GPU, rank ``i`` on ``gpus[i]``; a MIG-enabled GPU gives its one full-size instance). The
    driver answers :class:`~miso.sched.events.GangStarted` or
    :class:`~miso.sched.events.GangFailed`."""

    job: str
    gpus: tuple[str, ...]
    plan_id: int
    why: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class StopGang(Decision):
    """Checkpoint every process of ``job``'s whole-GPU run together and put the job back in
    the queue; its GPUs stay held."""

    job: str
    reason: str = ""
