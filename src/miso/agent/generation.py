"""The node's agent generation: fencing by epoch, not by a shared lease file.

Every agent that starts on a node (a restart by Ray, a new cluster after the head was killed)
takes the next generation of the node: one integer in ``<agent workdir>/generation``, bumped
under ``flock`` and written in place. Each guard it starts is told its generation and reads the
file (a descriptor it inherits) every poll: a guard that sees a newer generation ends its job
(:mod:`miso.agent.guard`, ``agent replaced``). Before the new agent launches anything it ends
every leftover guard of its node (found in ``/proc`` by the exit record under its workdir) and
waits until they are gone, so an attempt of the old life never runs beside one of the new.

A lease file renewed in place by every incarnation could not do this: an old guard reading it
kept seeing a fresh lease (issue 26, item 2).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import time
from pathlib import Path

from miso.agent import guard, jobprocs

log = logging.getLogger(__name__)

#: How a guard's script path ends (an older install of miso may sit elsewhere).
GUARD_TAIL = "/miso/agent/guard.py"
#: How long (s) leftover guards get to end their jobs themselves, then after SIGHUP.
SELF_FENCE_S = 2.0
HANGUP_S = 10.0


def bump(workdir: Path) -> int:
    """Take the node's next generation (1 for a fresh workdir); returns it."""
    fd = os.open(workdir / "generation", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        try:
            gen = int(text) + 1 if text else 1
        except ValueError:
            gen = 1
        os.pwrite(fd, f"{gen:20d}\n".encode(), 0)
        os.fsync(fd)
        return gen
    finally:
        os.close(fd)


def current(fd: int) -> int | None:
    """The generation in the file open as ``fd`` (None: unreadable now)."""
    try:
        return int(os.pread(fd, 64, 0).decode(errors="replace").strip())
    except (OSError, ValueError):
        return None


def reader(workdir: Path) -> int:
    """A read-only descriptor of the generation file, inherited by every guard."""
    return os.open(workdir / "generation", os.O_RDONLY | os.O_NOFOLLOW)


def guard_generation(argv: list[str], workdir: Path) -> int | None:
    """For a process's ``argv``: -1 when it is a guard of this node without a generation (an
    agent before this one was built), its generation when it has one, None when it is not a
    guard of this node."""
    if not any(a == guard.__file__ or a.endswith(GUARD_TAIL) for a in argv) \
            or "--exit-record" not in argv:
        return None
    i = argv.index("--exit-record")
    prefix = str(workdir).rstrip("/") + "/"
    if i + 1 >= len(argv) or not argv[i + 1].startswith(prefix):
        return None
    if "--generation" in argv:
        j = argv.index("--generation")
        with contextlib.suppress(IndexError, ValueError):
            return int(argv[j + 1])
    return -1


def leftover_guards(workdir: Path, generation: int) -> list[int]:
    """Pids of the guards of this node's older generations still alive: processes of this
    agent's own account (a job's process may forge a guard's command line, not its owner)."""
    out = []
    me = os.geteuid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != me:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read(1 << 16).split(b"\0")]
        except OSError:
            continue
        gen = guard_generation(argv, workdir)
        if gen is not None and gen != generation:
            out.append(int(name))
    return out


def fence_leftovers(workdir: Path, generation: int) -> int:
    """End every leftover guard of the node (they see the new generation and end their jobs;
    those that do not are hung up on, then killed with their cgroup and process group) and
    wait until none is left; returns how many there were."""
    pids = leftover_guards(workdir, generation)
    if not pids:
        end_orphaned_cgroups()
        return 0
    log.warning("%s: %d guard(s) of an older agent still run: fencing them before any launch",
                workdir.name, len(pids))
    for wait, sig in ((SELF_FENCE_S, None), (HANGUP_S, signal.SIGHUP),
                      (1.0, signal.SIGKILL)):
        left = [p for p in pids if jobprocs.alive(p)]
        for p in left:
            if sig == signal.SIGKILL:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p, signal.SIGKILL)
                jobprocs.end_cgroup(p)
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_running(p) for p in left):
            time.sleep(0.05)
    end_orphaned_cgroups()
    return len(pids)


def end_orphaned_cgroups() -> int:
    """Kill what is left in the attempt cgroups (``miso-<guard pid>``, beside this agent's
    own) whose guard is gone: the processes of a job whose guard was killed outright, which
    no guard will end. Returns how many processes were there."""
    home = jobprocs.own_cgroup()
    if home is None:
        return 0
    try:
        names = os.listdir(home)
    except OSError:
        return 0
    n = 0
    for name in names:
        pid = name.removeprefix("miso-")
        if name.startswith("miso-") and pid.isdigit() and not _running(int(pid)):
            n += jobprocs.end_cgroup(int(pid))
    if n:
        log.warning("ended %d process(es) of jobs whose guard was gone", n)
    return n


def _running(pid: int) -> bool:
    """Alive and not a zombie (a guard of this process that ended but is not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
