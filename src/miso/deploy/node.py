"""One node's Ray, owned by one process that leaves nothing behind (``miso node``).

``ray start --block`` runs as this process's child. The process is a child subreaper
(``PR_SET_CHILD_SUBREAPER``): Ray's daemons, its workers, miso's agent and every job process
(whatever session or process group they start) stay its descendants even when their parent
dies, so Slurm's process tracking keeps seeing them and this process can end them all. On
SIGTERM or SIGINT (``scancel``, ``systemctl stop``, srun forwarding) it sends SIGTERM to the
jobs below it (a job that uses :mod:`miso.job` saves and exits 75) and gives them ``grace``
seconds while Ray still runs, then stops Ray, SIGKILLs what is left and waits for it.
Readiness (the node joined its cluster) is reported to systemd with ``READY=1`` when
``$NOTIFY_SOCKET`` is set (``Type=notify`` units).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def descendants(root: int) -> list[int]:
    """PIDs below ``root`` in the process tree (from /proc; zombies included)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pp = _ppid(int(entry))
            if pp is not None:
                children.setdefault(pp, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def reap() -> None:
    """Collect every exited child (orphans re-parented to us included), without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def alive_descendants(root: int) -> list[int]:
    reap()
    return [p for p in descendants(root) if not _zombie(p)]


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(raw.decode(errors="replace").split("\0")).strip()[:200]


def is_job_process(pid: int) -> bool:
    """A miso job or its guard (the processes worth waiting for: they may be saving)."""
    if "miso/agent/guard.py" in command_line(pid):
        return True
    try:
        return b"\0MISO_JOB_ID=" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


#: Seconds Ray's own daemons get once no job is left (they need less; some ignore SIGTERM).
RAY_GRACE_S = 1.0


def end_descendants(grace: float, *, poll: float = 0.2) -> list[str]:
    """Wait up to ``grace`` s for the jobs below us to exit (they save on SIGTERM), then up to
    :data:`RAY_GRACE_S` for the rest, then SIGKILL what is left and wait for it; returns
    ``"PID command"`` of each process that had to be killed."""
    me = os.getpid()
    deadline = time.time() + grace
    while time.time() < deadline and any(is_job_process(p) for p in alive_descendants(me)):
        time.sleep(poll)
    deadline = min(deadline, time.time() + RAY_GRACE_S)
    while time.time() < deadline and alive_descendants(me):
        time.sleep(poll)
    killed: list[str] = []
    for _ in range(50):  # a process may fork while we kill: repeat until none is left
        left = alive_descendants(me)
        if not left:
            break
        for p in left:
            cmd = command_line(p)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
                killed.append(f"{p} {cmd}")
        time.sleep(0.1)
    reap()
    return killed


def notify_ready() -> None:
    """Tell systemd the node is up (``Type=notify``); nothing without ``$NOTIFY_SOCKET``."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    addr = "\0" + path[1:] if path.startswith("@") else path
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        s.send(b"READY=1")


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_free(port: int, host: str = "0.0.0.0") -> bool:  # noqa: S104 - a bind test only
    """True when nothing on this node holds ``port`` (TCP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def ray_command() -> list[str]:
    """``ray`` run by this interpreter: Ray's workers (miso's agent and controller among
    them) use the interpreter of ``ray start``, which must be the one miso is installed in."""
    return [sys.executable, "-m", "ray.scripts.scripts"]


def ray_env(env: dict[str, str] | None) -> dict[str, str]:
    """The environment of ``ray start``: ``env`` (or ours) with the settings that let each
    guard outlive its agent long enough to end its job (:data:`miso.raycluster.RAY_ENV`)."""
    from miso.raycluster import RAY_ENV  # noqa: PLC0415

    return {**(os.environ if env is None else env), **RAY_ENV}


class Node:
    """``ray start --block`` as a child, stopped and reaped with everything below it."""

    def __init__(self, args: list[str], *, grace: float, log: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.args = args
        self.grace = grace
        self.log = log
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def start(self) -> None:
        become_subreaper()
        out = open(self.log, "ab") if self.log else None  # noqa: SIM115 - given to the child
        try:
            self.proc = subprocess.Popen([*ray_command(), *self.args], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=ray_env(self.env))
        finally:
            if out is not None:
                out.close()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> list[str]:
        """SIGTERM the jobs below us (they save and exit 75) and wait up to ``grace`` s for
        them while Ray still runs, then stop Ray and every other descendant; returns those
        that had to be SIGKILLed."""
        self.stopping = True
        me = os.getpid()
        for p in alive_descendants(me):
            if is_job_process(p):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGTERM)
        deadline = time.time() + self.grace
        while time.time() < deadline and any(is_job_process(p) for p in alive_descendants(me)):
            time.sleep(0.2)
        if self.running():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        return end_descendants(max(0.0, deadline - time.time()))


def serve(node: Node, *, ready: Callable[[], bool], on_ready: Callable[[], None] | None = None,
          before_stop: Callable[[], None] | None = None, ready_timeout: float = 120.0,
          say: Callable[[str], None] = print) -> int:
    """Run ``node`` until SIGTERM/SIGINT or until its Ray exits; always ends its processes.

    ``ready()`` says when the node has joined; ``on_ready`` runs then (e.g. start miso on the
    head), ``before_stop`` before Ray is stopped (e.g. checkpoint the jobs). Returns 0 after a
    requested stop, 1 when Ray exited by itself or never got ready."""
    stop = {"sig": 0}

    def on_signal(sig: int, _frame: object) -> None:
        stop["sig"] = sig

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        node.start()
        deadline = time.time() + ready_timeout
        while not stop["sig"] and not ready():
            if not node.running() or time.time() > deadline:
                say("error: Ray did not start on this node" + (
                    f" (see {node.log})" if node.log else ""))
                code = 1
                break
            time.sleep(0.2)
        if code == 0 and not stop["sig"]:
            if on_ready is not None:
                on_ready()
            notify_ready()
            while not stop["sig"] and node.running():
                time.sleep(0.2)
                reap()
            if not stop["sig"]:
                say("error: Ray exited on this node")
                code = 1
    finally:
        if before_stop is not None:
            with contextlib.suppress(Exception):
                before_stop()
        killed = node.stop()
        if killed:
            say(f"miso node: killed {len(killed)} processes still running after the jobs "
                "ended: " + "; ".join(killed))
        for s, h in old.items():
            signal.signal(s, h)
    return code
