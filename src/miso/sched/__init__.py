"""Scheduling core shared by the simulator (:mod:`miso.sim`) and the live controller.

Vocabulary: :mod:`~miso.sched.events` (what happened), :mod:`~miso.sched.decisions` (what to
do), :class:`~miso.sched.state.ClusterState` (what both sides know), and policies
(:class:`~miso.sched.policy.Policy`: ``decide(now, event, state) -> list[Decision]``) built by
name with :func:`make_policy` from the table :data:`miso.sched.policies.POLICIES` (``nopart``,
``optsta``, ``mps``, ``oracle``, ``miso``, ``miso+``).
Policies do no I/O, know nothing of Ray, NVML or simulation, and get speeds through an injected
:class:`~miso.sched.policy.SpeedEstimator` (:mod:`~miso.sched.estimators`).

Event-loop contract (how a driver uses a policy)
------------------------------------------------
1. The driver owns one ``ClusterState``, one policy and one clock
   (:mod:`~miso.sched.clock`). At start it delivers ``GpuAdded`` for every GPU, then events as
   they happen, one at a time, in time order.
2. For each event it runs the one driver step (:class:`~miso.sched.driver.DriverStep`): drop a
   stale event, ``state.observe(now, ev)``, ``ds = policy.decide(now, ev, state)``, then for
   each ``d`` in ``ds`` in order ``state.apply(now, d)`` (validates; a ``ContractError``, a
   policy bug, skips the decision and is reported) and then execute ``d``. ``JobProgress``
   (remaining work in full-GPU seconds, :mod:`~miso.sched.progress`) is folded into the job's
   state without a decision.
3. ``PlaceJob`` is bookkeeping only (queue -> GPU). Jobs run once ``ApplyLayout`` / ``RunMps``
   is acknowledged or while ``StartProfiling`` runs them under MPS.
4. Plan ids come from ``state.new_plan_id()``: strictly increasing over the cluster. Every
   ``StartProfiling`` / ``ApplyLayout`` / ``RunMps`` carries one; the driver answers with
   ``ProfilingFinished`` / ``LayoutApplied`` (or ``LayoutFailed``) carrying the same id.
   A newer plan for a GPU supersedes a pending one; acks of superseded plans are ignored by
   ``observe`` (the driver may still deliver them; policies ignore stale ids too).
5. ``LayoutFailed``: the GPU ends with no instances, its jobs checkpointed but still resident;
   the policy then retries, picks another layout or requeues (built-ins requeue).
6. ``JobFinished`` / ``JobFailed``: the job leaves its GPU; its instance stays, idle, until the
   policy applies a new layout. ``JobState.gpu`` keeps the last GPU for the policy to read.
7. ``SpeedObserved`` once per job per placement run (first steady rate); ``JobSpeedChanged``
   when a running job's rate departs from that baseline by more than the driver's threshold.
8. ``WakeUp(at, tag)`` asks for a ``Tick(tag)`` at time ``at`` (cool-downs, batching).
9. Drivers never decide; policies never execute. Events and decisions are plain frozen
   dataclasses, so one log of both replays a run (sim and live alike).
"""

from miso.sched.decisions import (
    ApplyLayout,
    Decision,
    PlaceJob,
    RequeueCause,
    RequeueJob,
    RunMps,
    StartProfiling,
    WakeUp,
)
from miso.sched.estimators import NoisyOracle, PredictorEstimator, TrueSpeeds, true_speeds
from miso.sched.events import (
    MPS_LEVELS,
    Event,
    GpuAdded,
    GpuRemoved,
    JobCheckpointable,
    JobFailed,
    JobFinished,
    JobProgress,
    JobSpec,
    JobSpeedChanged,
    JobStopped,
    JobSubmitted,
    LayoutApplied,
    LayoutFailed,
    ProfilingFinished,
    SpeedObserved,
    Tick,
)
from miso.sched.policy import Policy, SpeedEstimator, SpeedTable
from miso.sched.speeds import workload_speeds
from miso.sched.state import (
    ClusterState,
    ContractError,
    GpuState,
    JobState,
    JobStatus,
    Phase,
)

# The policy table last: the policies import the modules above.
from miso.sched.policies import make_policy, policy_names, register  # noqa: E402  isort: skip

__all__ = [
    "MPS_LEVELS", "ApplyLayout", "ClusterState", "ContractError", "Decision", "Event", "GpuAdded",
    "GpuRemoved", "GpuState", "JobCheckpointable", "JobFailed", "JobFinished", "JobProgress",
    "JobSpec", "JobStopped",
    "JobSpeedChanged", "JobState", "JobStatus", "JobSubmitted", "LayoutApplied", "LayoutFailed",
    "NoisyOracle", "Phase", "PlaceJob", "Policy", "PredictorEstimator", "ProfilingFinished",
    "RequeueCause", "RequeueJob", "RunMps", "SpeedEstimator", "SpeedObserved", "SpeedTable",
    "StartProfiling",
    "Tick", "TrueSpeeds", "WakeUp", "make_policy", "policy_names", "register", "true_speeds",
    "workload_speeds",
]
