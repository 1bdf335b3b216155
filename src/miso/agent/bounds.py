"""The bounds of one job on its node (issue 26, item 3): processes, host memory, I/O weight
and a disk budget for its own files, turned into the guard's options.

The node's defaults come from the agent (``MISO_JOB_MAX_PROCS``, ``MISO_JOB_HOST_MEMORY_GB``,
``MISO_JOB_DISK_GB``, ``MISO_JOB_IO_WEIGHT``); a job's own host-memory request
(``miso submit --host-memory-gb``) replaces the memory default. The guard applies them: cgroup
v2 files where the controllers are available, rlimits set before the drop to the job's
account otherwise, and its own measurements (:mod:`miso.agent.guard`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
#: Default bound on a job's processes (and never above a quarter of the kernel's pid_max).
DEFAULT_MAX_PROCS = 4096
DEFAULT_HOST_MEMORY_GB = 32.0
DEFAULT_DISK_GB = 50.0
DEFAULT_IO_WEIGHT = 100


def pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 32768


def _env_number(name: str, default: float) -> float:
    try:
        v = float(os.environ.get(name, default))
    except ValueError:
        return default
    return v if v > 0 else default


@dataclass(frozen=True)
class JobBounds:
    """Per-job bounds of a node (0 = none)."""

    max_procs: int = DEFAULT_MAX_PROCS
    host_memory_gb: float = DEFAULT_HOST_MEMORY_GB
    disk_gb: float = DEFAULT_DISK_GB
    io_weight: int = DEFAULT_IO_WEIGHT

    @classmethod
    def node_defaults(cls) -> JobBounds:
        """This node's defaults: the environment's, else the built-in ones; the process bound
        kept below a quarter of the kernel's pid_max."""
        procs = int(_env_number("MISO_JOB_MAX_PROCS", DEFAULT_MAX_PROCS))
        return cls(max_procs=max(16, min(procs, pid_max() // 4)),
                   host_memory_gb=_env_number("MISO_JOB_HOST_MEMORY_GB",
                                              DEFAULT_HOST_MEMORY_GB),
                   disk_gb=_env_number("MISO_JOB_DISK_GB", DEFAULT_DISK_GB),
                   io_weight=int(min(10000, _env_number("MISO_JOB_IO_WEIGHT",
                                                        DEFAULT_IO_WEIGHT))))

    def guard_args(self, disk_dirs: list[str | Path],
                   host_memory_gb: float | None = None) -> list[str]:
        """The guard's options for a job (``host_memory_gb``: the job's own request)."""
        mem = host_memory_gb if host_memory_gb and host_memory_gb > 0 else self.host_memory_gb
        out = []
        if self.max_procs > 0:
            out += ["--max-procs", str(int(self.max_procs))]
        if mem > 0:
            out += ["--max-memory", str(int(mem * GIB))]
        if self.io_weight > 0:
            out += ["--io-weight", str(int(self.io_weight))]
        if self.disk_gb > 0 and disk_dirs:
            out += ["--disk-budget", str(int(self.disk_gb * GIB)),
                    "--disk-dirs", json.dumps([str(d) for d in disk_dirs])]
        return out
