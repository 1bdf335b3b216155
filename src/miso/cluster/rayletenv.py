"""Whether this node's raylet keeps a dead worker's children, which "each job at most once"
needs (issue 26): by default a Ray worker that exits has its children SIGKILLed by the
raylet, so an agent actor dying (its head SIGKILLed) took every guard of its node with it
while the jobs, reparented to pid 1, ran on unwatched beside the next cluster's attempts.
Every Ray miso starts itself has ``RAY_kill_child_processes_on_worker_exit=0``
(:data:`miso.raycluster.RAY_ENV`); a Ray started by someone else (KubeRay, a hand-run ``ray
start``) must have it too. An agent actor checks its raylet's environment in /proc (the
raylet is its parent; the agent runs as root) and refuses to start on a raylet without it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: The variable, and the value a raylet under miso must have.
SETTING = "RAY_kill_child_processes_on_worker_exit"
NEEDED = "0"


def raylet_of(pid: int, proc: Path = Path("/proc"), depth: int = 4) -> int | None:
    """The raylet among ``pid``'s parents (a Ray worker's parent), or None."""
    for _ in range(depth):
        try:
            stat = (proc / str(pid) / "stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
            if pid <= 1:
                return None
            if (proc / str(pid) / "comm").read_text().strip() == "raylet":
                return pid
        except (OSError, ValueError, IndexError):
            return None
    return None


def raylet_setting(pid: int | None = None, proc: Path = Path("/proc")) -> str | None:
    """:data:`SETTING`'s value in the environment of the raylet above ``pid`` (default: this
    process): "" when the raylet lacks it; None when no raylet is found or it cannot be read
    (not under Ray, or not root)."""
    raylet = raylet_of(os.getpid() if pid is None else pid, proc)
    if raylet is None:
        return None
    try:
        env = (proc / str(raylet) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    key = SETTING.encode() + b"="
    return next((e[len(key):].decode(errors="replace") for e in env if e.startswith(key)), "")


def refuse_unless_children_kept(pid: int | None = None, proc: Path = Path("/proc")) -> None:
    """RuntimeError (one line, what to do) when this node's raylet kills a dead worker's
    children; a warning in the log when it cannot be told."""
    got = raylet_setting(pid, proc)
    if got is None:
        log.warning("miso agent: could not read this node's raylet environment; it must have "
                    "%s=%s (docs/deploy.md) or a crash may leave jobs running twice", SETTING,
                    NEEDED)
        return
    if got != NEEDED:
        raise RuntimeError(
            f"refusing to start the miso agent: this node's Ray was started without "
            f"{SETTING}={NEEDED} (it has {got or 'nothing'}), so a crash of the agent would "
            f"leave its jobs running unwatched beside their next attempts; restart Ray on this "
            f"node with {SETTING}={NEEDED} in its environment (docs/deploy.md)")
