"""A job's state: the one vocabulary of the scheduling core, the live job store, the API and
the CLI (the strings are what the store persists and ``miso status --json`` shows).

The core (:class:`~miso.sched.state.ClusterState`) moves a job through ``queued`` ->
``placed`` -> ``running`` -> ``finished`` / ``failed``. The live job store
(:mod:`miso.controller.schema`) records what the job's process is doing instead of ``placed``:
``profiling`` and ``checkpointing``, and ``cancelled`` for a job its user cancelled (the core
sees that as ``failed``). Standard library only, so the store and the CLI can import it cheaply.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """Every state a job can be in (see the module docstring for who uses which)."""

    QUEUED = "queued"
    PLACED = "placed"                # core: resident on a GPU, not running yet (or checkpointed)
    PROFILING = "profiling"          # store: running in an MPS profiling run
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"  # store: asked to checkpoint and stop
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"          # store: cancelled by its user (core: failed)
    OVER_LIMIT = "over_limit"        # store: ended for one of its bounds on the node (core:
    #                                  failed); the reason says which (issue 26, item 3)


#: States a job never leaves.
TERMINAL = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.OVER_LIMIT)
#: How the reason of a job ended for a bound begins (its store state is ``over_limit``).
LIMIT_REASON = "killed for a limit: "
#: The states the core uses; the job store uses every state but ``placed``.
CORE = (JobStatus.QUEUED, JobStatus.PLACED, JobStatus.RUNNING, JobStatus.FINISHED,
        JobStatus.FAILED)
STORE = tuple(s for s in JobStatus if s is not JobStatus.PLACED)
#: The core's states a job never leaves (a cancelled job is a failed one there).
CORE_ENDED = (JobStatus.FINISHED, JobStatus.FAILED)
