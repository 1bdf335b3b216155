"""How the agent starts a job process: under its guard, with the job's environment.

Nothing that runs as root takes a job's environment, files or paths: the guard starts with
an isolated interpreter (``python -I -S``) and a fixed environment (:data:`GUARD_ENV`); the job's
environment reaches the guard in a 0600 file of the agent's attempt directory and is applied
only to the job, after the drop to its owner's uid (:mod:`miso.agent.guard`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from miso.agent import guard, runas

#: Prefixes of the agent's own environment that jobs do not inherit.
INTERNAL_ENV_PREFIXES = ("RAY_", "MISO_")
#: The whole environment of a guard (it runs as root: nothing of the job's, nor the agent's).
GUARD_ENV = {"PATH": runas.DEFAULT_PATH, "LC_ALL": "C.UTF-8"}
#: Default cap of one attempt's log, MiB (``MISO_LOG_CAP_MB`` or the agent's ``log_cap_mb``).
DEFAULT_LOG_CAP_MB = 64.0


def log_cap_bytes(mb: float | None = None) -> int:
    """The log cap in bytes: ``mb`` MiB, else ``MISO_LOG_CAP_MB``, else the default; 0 = none."""
    if mb is None:
        try:
            mb = float(os.environ.get("MISO_LOG_CAP_MB", DEFAULT_LOG_CAP_MB))
        except ValueError:
            mb = DEFAULT_LOG_CAP_MB
    return int(max(0.0, mb) * (1 << 20))


def job_base_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) without miso's and Ray's internal variables."""
    src = os.environ if env is None else env
    return {k: v for k, v in src.items() if not k.startswith(INTERNAL_ENV_PREFIXES)}


def start_guarded(python: str, cmd: list[str], env: dict[str, str],
                  acct: runas.Account | None, *, attempt_dir: Path, cwd: str | None,
                  record: Path, log_file: Path, log_cap: int,
                  lease_fd: int, bounds: list[str] | None = None,
                  fence: tuple[int, int] | None = None,
                  ) -> subprocess.Popen[bytes]:
    """Start ``cmd`` under its guard, output appended to ``log_file``; returns the guard.
    ``bounds``: the guard's options bounding the job (:mod:`miso.agent.bounds`).
    ``fence``: the descriptor of the node's generation file and the agent's generation
    (:mod:`miso.agent.generation`)."""
    kw = runas.popen_kwargs(acct)
    ids = [] if "user" not in kw else [
        "--uid", str(kw["user"]), "--gid", str(kw["group"]),
        "--groups", ",".join(str(g) for g in kw.get("extra_groups") or [])]
    # The guard runs as the agent (root) with an isolated interpreter and a fixed
    # environment; the job's environment and cwd apply to the job alone, after
    # it has switched to its owner's account.
    env_file = attempt_dir / "env.json"
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "w") as f:
        json.dump(env, f)
    gen_args = [] if fence is None else ["--generation-fd", str(fence[0]),
                                         "--generation", str(fence[1])]
    guarded = [python, "-I", "-S", guard.__file__, "--lease-fd", str(lease_fd), *gen_args,
               "--agent-pid", str(os.getpid()), "--exit-record", str(record),
               "--env-file", str(env_file), "--log", str(log_file),
               "--log-cap", str(log_cap),
               "--umask", str(kw.get("umask", 0o077)), *ids,
               *(["--cwd", str(cwd)] if cwd else []), *(bounds or []), "--", *cmd]
    with open(runas.open_log(log_file), "ab") as out:
        return subprocess.Popen(
            guarded, env=dict(GUARD_ENV), cwd=attempt_dir, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(lease_fd,) if fence is None else (lease_fd, fence[0]))
