"""What a submission is checked for before it reaches the store, and the core's spec of a
stored job: the parts of :meth:`miso.controller.submissions.Submissions.submit` that need
nothing of the running controller but its ``check_commands`` setting.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Any

from miso.agent import runas
from miso.controller.commandcheck import command_exists
from miso.controller.runtime import Runtime, SubmitError
from miso.controller.store import GIB_PER_GB, JobRecord
from miso.mig import GPU_MODELS, geometry
from miso.sched import JobSpec
from miso.workloads import catalogue


def check_request(command: list[str], env: dict[str, str] | None, unix_user: str | None,
                  workload: str | None, memory_gb: float | None,
                  host_memory_gb: float | None, *, check_commands: bool = True,
                  ) -> tuple[list[str], str | None, float, float]:
    """The submission's command (as strings), workload (named, or read from the reference
    workload's flags), GPU memory in GB and in GiB (given in GB, else the workload's); raises
    :class:`SubmitError` with one line on what is wrong."""
    command = [str(c) for c in command]
    if not command:
        raise SubmitError("no command given")
    for k, v in (env or {}).items():
        if not k or "=" in k or "\0" in k or "\0" in str(v):
            raise SubmitError(f"bad environment variable {k!r}")
    if check_commands and not command_exists(command[0]):
        raise SubmitError(f"unknown command {command[0]!r}: not found on PATH")
    check_program_of_account(command[0], env or {}, unix_user)
    if workload is None and "miso.emuworkload" in command and "--workload" in command:
        i = command.index("--workload")
        workload = command[i + 1] if i + 1 < len(command) else None
    if workload is not None and workload not in catalogue():
        raise SubmitError(f"unknown workload {workload!r}")
    if memory_gb is None:
        gib = catalogue()[workload].memory_gb if workload else 1.0
        memory_gb = gib / GIB_PER_GB
    else:
        if not (isinstance(memory_gb, int | float) and math.isfinite(memory_gb)
                and memory_gb > 0):
            raise SubmitError(f"--memory-gb must be a positive number of GB, got "
                              f"{memory_gb}")
        gib = float(memory_gb) * GIB_PER_GB
    if host_memory_gb is not None and not (
            isinstance(host_memory_gb, int | float) and not isinstance(host_memory_gb, bool)
            and math.isfinite(host_memory_gb) and 0 < host_memory_gb <= 65536):
        raise SubmitError(f"--host-memory-gb must be a number of GB in (0, 65536], got "
                          f"{host_memory_gb!r}")
    return command, workload, memory_gb, gib


def cluster_geometries(rt: Runtime) -> list[Any]:
    """The cluster's GPU geometries (every known model's while no GPU has joined)."""
    with rt.lock:
        geoms = list({g.geom for g in rt.gpus.values()})
    return geoms or [geometry(m) for m in GPU_MODELS]


def largest_slice(rt: Runtime) -> tuple[float, str]:
    """The largest slice of any GPU of the cluster (of any known model while none has
    joined): its memory (GiB) and '<profile> of <model>'."""
    with rt.lock:
        # a few models, not 1,000; by identity (geometries are built once per model and
        # compare by identity): their hash is Python code, 1,024 calls per submission
        geoms = list({id(g.geom): g.geom for g in rt.gpus.values()}.values())
    if not geoms:
        geoms = [geometry(m) for m in GPU_MODELS]
    best = max((p.memory_gib, p.name, g.model.name) for g in geoms for p in g.profiles)
    return best[0], f"{best[1]} of {best[2]}"


def job_spec(rec: JobRecord, priority: int = 0, ahead: bool = False) -> JobSpec:
    """The core's spec of a stored job."""
    gib = rec.memory_gib if rec.memory_gib is not None else rec.memory_gb * GIB_PER_GB
    return JobSpec(rec.id, rec.name, gib, rec.workload,
                   checkpointable=rec.checkpointable is not False, owner=rec.owner or "",
                   priority=priority, num_gpus=rec.num_gpus or 1, nodes=rec.nodes,
                   profile=rec.profile, after=tuple(rec.after or ()), ahead=ahead)


def check_program_of_account(program: str, env: dict[str, str], unix_user: str | None) -> None:
    """Refuse at submit time a bare program name that a job switching to ``unix_user`` would
    not find: such a job gets the standard ``PATH`` (or the one passed with ``--env``), not the
    submitter's; ``miso submit`` sends absolute paths, so this catches direct API clients."""
    if unix_user is None or os.geteuid() != 0:
        return
    if "/" in program:  # e.g. a venv's python whose base interpreter the account cannot reach
        from miso.controller.reachable import unreachable

        why = unreachable(os.path.abspath(program), unix_user)
        if why:
            raise SubmitError(f"{why}; jobs run as {unix_user}: use a Python (or program) "
                              "that account can read and run")
        return
    path = env.get("PATH") or runas.DEFAULT_PATH
    if shutil.which(program, path=path) is None:
        raise SubmitError(
            f"{program!r} is not on the PATH of jobs run as {unix_user} ({path}): give its "
            f"absolute path (e.g. `-- $(command -v {program}) ...`; for miso.job, a Python "
            "where miso is installed), or pass --env PATH=...")
