"""An attempt's state: the one vocabulary of the node agent's reports and the controller's
attempt log (the strings are what the agent reports and the job store persists). Standard
library only, so agent, transport and controller import it from below all of them.

An attempt (one run of a job's process) is ``running`` until its process ends: ``finished``
(exit 0), ``checkpointed`` (it saved and stopped when asked), ``killed`` (stopped without a
checkpoint), ``fenced`` (its guard stopped it: the controller's lease ran out), ``limit``
(its guard stopped it at one of its bounds: processes, memory, disk), ``failed``
(any other exit); the controller records ``lost`` for an attempt whose node it lost.
"""

from __future__ import annotations

from enum import StrEnum


class AttemptStatus(StrEnum):
    """Every state an attempt can be in (see the module docstring)."""

    RUNNING = "running"
    FINISHED = "finished"
    CHECKPOINTED = "checkpointed"
    KILLED = "killed"
    FENCED = "fenced"
    LIMIT = "limit"           # its guard stopped it at one of its bounds (pids, memory, disk)
    FAILED = "failed"
    LOST = "lost"             # controller: the attempt's node was lost
