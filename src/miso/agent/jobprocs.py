"""The processes of one job attempt, as its guard and agent find and end them: ``/proc``
(descendants, liveness, the attempt token), the attempt's cgroup v2 (``miso-<guard pid>``
under the agent's own) and the guard's subreaper tree (:class:`Tracker`).

Stdlib only: the guard (:mod:`miso.agent.guard`) imports it in its isolated interpreter
(``python -I -S``), where miso cannot be imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

PR_SET_CHILD_SUBREAPER = 36


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (an agent that died and is not reaped yet, which may
    take seconds once it is orphaned) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _stat(str(pid))
    return stat is not None and stat[1] not in ("Z", "X")


def _stat(pid: str) -> tuple[int, str] | None:
    """(ppid, state) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read(4096)
    except OSError:
        return None
    fields = text.rpartition(b")")[2].split()  # the name (comm) may hold spaces and ")"
    try:
        return int(fields[1]), fields[0].decode()
    except (IndexError, ValueError):
        return None


def descendants(root: int) -> list[int]:
    """Live (not zombie) descendants of ``root``, from ``/proc``."""
    children: dict[int, list[int]] = {}
    live: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(name)
        if st is None:
            continue
        children.setdefault(st[0], []).append(int(name))
        if st[1] != "Z":
            live.add(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return [p for p in out if p in live]


def token_pids(token: str) -> list[int]:
    """Processes whose environment holds ``MISO_ATTEMPT_TOKEN=<token>`` (a job may clear its
    environment: the last resort, after the cgroup and the guard)."""
    needle = f"\0MISO_ATTEMPT_TOKEN={token}\0".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = b"\0" + f.read(1 << 20) + b"\0"
        except OSError:
            continue
        if needle in env:
            out.append(int(name))
    return out


def cgroup2_root() -> str | None:
    """Mount point of the cgroup v2 hierarchy, if any."""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and parts[2] == "cgroup2":
                    return parts[1]
    except OSError:
        pass
    return None


def cgroup_procs(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def kill_cgroup(path: str) -> None:
    """SIGKILL every process of a cgroup (``cgroup.kill``, else one by one)."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:
        for p in cgroup_procs(path):
            if p != os.getpid():
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)


def own_cgroup() -> str | None:
    """This process's cgroup v2 directory, if the node has a cgroup2 mount."""
    mnt = cgroup2_root()
    if mnt is None:
        return None
    try:
        with open("/proc/self/cgroup") as f:
            own = next(ln.split(":", 2)[2].strip() for ln in f if ln.startswith("0::"))
    except (OSError, StopIteration):
        return None
    return os.path.join(mnt, own.lstrip("/"))


def end_cgroup(guard_pid: int) -> int:
    """Kill what is left in the cgroup of a guard that is gone (the guard was started by this
    process, so its cgroup is ``miso-<pid>`` under this process's own); returns how many
    processes were still there."""
    home = own_cgroup()
    path = os.path.join(home, f"miso-{guard_pid}") if home else None
    if path is None or not os.path.isdir(path):
        return 0
    left = cgroup_procs(path)
    kill_cgroup(path)
    deadline = time.time() + 2.0
    while cgroup_procs(path) and time.time() < deadline:
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        os.rmdir(path)
    return len(left)


class Tracker:
    """The set of the job's processes: a cgroup v2 when usable, the subreaper tree always."""

    def __init__(self) -> None:
        self.cgroup: str | None = None
        self.subreaper = False
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            self.subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        self.home = own_cgroup()
        if self.home is None:
            return
        try:
            path = os.path.join(self.home, f"miso-{os.getpid()}")
            if os.path.isdir(path):  # left by an earlier guard with this pid
                kill_cgroup(path)
                os.rmdir(path)
            os.mkdir(path, 0o755)
            self.cgroup = path
        except OSError:
            self.cgroup = None

    def enter(self) -> None:
        """Move the guard into the attempt's cgroup (its next child starts there)."""
        if self.cgroup is None:
            return
        try:
            with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            self.close()

    def leave(self) -> None:
        """Move the guard back out: only the job's processes stay in the cgroup."""
        if self.cgroup is None or self.home is None:
            return
        try:
            with open(os.path.join(self.home, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            pass

    def left(self) -> list[int]:
        """Processes of the job still alive."""
        me = os.getpid()
        cg = [p for p in cgroup_procs(self.cgroup) if p != me] if self.cgroup else []
        return sorted(set(cg) | set(descendants(me)))

    def kill_all(self, reap: object) -> int:
        """SIGKILL every process of the job until none is left; returns how many remain
        (0 unless one cannot be killed within ~5 s)."""
        deadline = time.time() + 5.0
        while True:
            if self.cgroup:
                kill_cgroup(self.cgroup)
            pids = descendants(os.getpid())
            for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first: no new forks
                for p in pids:
                    with contextlib.suppress(OSError):
                        os.kill(p, sig)
            reap()  # type: ignore[operator]
            rest = self.left()
            if not rest or time.time() > deadline:
                return len(rest)
            time.sleep(0.01)

    def close(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.cgroup)
            self.cgroup = None
