"""Fence for one job attempt: runs the job as its child and ends it, with every process it
started, when asked, when the job's main process exits, or when the node is fenced.

``python -I -S guard.py --lease-fd FD --agent-pid PID --env-file FILE [--exit-record FILE]
[--log FILE --log-cap BYTES] [--cwd DIR] [--umask N] [--uid N --gid N --groups N,N]
-- COMMAND...``

The guard runs as the agent (root on a real node), so it trusts nothing of the job: the agent
starts it with an isolated interpreter (``-I -S``) and a fixed environment, and the job's
environment arrives in ``--env-file`` (a 0600 file in the agent's own attempt directory, read
and removed at start). That environment, the job's working directory (``--cwd``, entered
after the drop) and the job's account (``--uid``/``--gid``/``--groups``) apply only to the
child. This module is stdlib only (it cannot import miso under ``-I``; it also starts fast).

The guard

* starts the job with ``SIGUSR1`` blocked (:mod:`miso.job` unblocks it once its handler is
  set, so an early checkpoint request waits instead of killing the job);
* forwards the checkpoint signal (``SIGUSR1``), ``SIGTERM`` and ``SIGINT`` to the job; after a
  SIGTERM (the node is going away: its agent dies with it) it no longer fences on the agent's
  death, only on the lease, so a job that saves on SIGTERM (:mod:`miso.job`) can finish saving;
* ends the attempt on ``SIGHUP`` (the agent's cancel), when the controller's lease has run out
  (the lease file, open as descriptor ``FD``, holds the lease's end in seconds since the
  epoch) or the agent has died, when a newer agent took the node (``--generation-fd FD
  --generation N``: the node's generation file no longer holds N), and when the job's main
  process exits;
* tracks the job's processes as a set, not a process group (a child that called ``setsid()``
  or double-forked has left the group): in a per-attempt cgroup v2 (``miso-<pid>`` under its
  own cgroup) where the node has a writable cgroup2 mount, killed with ``cgroup.kill``; and
  always as a child subreaper (``PR_SET_CHILD_SUBREAPER``), so orphaned descendants reparent
  to the guard, which kills every descendant it finds in ``/proc`` (stopped first, so that a
  fork loop cannot outrun it) until none is left. ``MISO_ATTEMPT_TOKEN`` in the job's
  environment is the last resort of the agent (:func:`token_pids`) when the guard is gone;
* on exit writes ``{"returncode", "fenced", "why", "time"}`` to the exit record (in the
  agent's attempt directory), so a job that finished on a lost node is never run again;
* copies the job's output (through a pipe) to the attempt's log, capped at ``--log-cap``
  bytes: past the cap it keeps the first quarter and the last half, with one line saying how
  many bytes were dropped from the middle (and ``<log>.cap``, a small JSON the agent reads);
  a write that fails (the disk is full) drops that output, never the job;
* exits with the job's exit code (128 + N when it died of signal N; 137 when ended).

An empty lease file (an agent no controller ever leased) means no fencing.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

POLL_S = 0.1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
#: Bytes of the note that replaces the middle of a capped log (fixed: rewritten in place).
MARK_BYTES = 100
#: Largest environment file the guard reads.
ENV_FILE_LIMIT = 4 << 20


def lease_until(fd: int) -> float | None:
    """The lease end in the file open as ``fd``, or None when there is none (or it cannot be
    read now)."""
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        return float(text) if text else None
    except (OSError, ValueError):
        return None


def replaced(fd: int, generation: int) -> bool:
    """Whether the node's agent generation (the file open as ``fd``) is no longer
    ``generation``: a newer agent took the node (:mod:`miso.agent.generation`), so this
    attempt must end. A file that cannot be read now fences nothing."""
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        return bool(text) and int(text) != generation
    except (OSError, ValueError):
        return False


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


def write_record(path: str | None, returncode: int | None, fenced: bool, why: str) -> None:
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(tmp, "w") as f:
            json.dump({"returncode": returncode, "fenced": fenced, "why": why,
                       "time": time.time()}, f)
        os.replace(tmp, path)
    except OSError:  # e.g. the disk is full: the agent still sees the exit code
        with contextlib.suppress(OSError):
            os.unlink(tmp)


# ---- the job's processes ----------------------------------------------------------------

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


# ---- output -----------------------------------------------------------------------------

class Output:
    """Copies the job's pipe to the log; a failed write drops the data (and says so later).

    With a cap, the log keeps its first ``cap // 4`` bytes, a fixed-size note of what was
    dropped, and the last ``cap // 2`` bytes (compacted in place, in chunks: the guard's
    memory does not grow with the output).
    """

    def __init__(self, fd: int, log: str | None = None, cap: int = 0) -> None:
        self.fd = fd
        self.dropped = 0  # lost to failed writes
        self.cut = 0  # dropped from the middle by the cap
        self.cap = cap if cap >= 8 * MARK_BYTES else 0
        self.log = log
        if log is not None:
            self.out = os.open(log, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            self.size = os.lseek(self.out, 0, os.SEEK_END)
        else:
            self.out, self.size = 1, 0

    def pump(self, timeout: float) -> bool:
        """Copy what is there within ``timeout`` s; False at end of file."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        data = os.read(self.fd, 65536)
        if not data:
            return False
        self.write(data)
        return True

    def write(self, data: bytes) -> None:
        if self.dropped:
            data = f"[miso: {self.dropped} bytes of output lost: disk full?]\n".encode() + data
        try:
            if self.log is None:
                os.write(self.out, data)
            else:
                os.pwrite(self.out, data, self.size)
                self.size += len(data)
                if self.cap and self.size > self.cap:
                    self._compact()
            self.dropped = 0
        except OSError:
            self.dropped += len(data)

    def _compact(self) -> None:
        head, keep = self.cap // 4, self.cap // 2
        start = head + MARK_BYTES
        src = self.size - keep
        self.cut += src - (start if self.cut else head)
        pos = 0
        while pos < keep:
            chunk = os.pread(self.out, min(1 << 20, keep - pos), src + pos)
            if not chunk:
                break
            os.pwrite(self.out, chunk, start + pos)
            pos += len(chunk)
        os.ftruncate(self.out, start + pos)
        self.size = start + pos
        note = (f"\n[miso: {self.cut} bytes dropped from the middle of this log; "
                f"cap {self.cap / (1 << 20):g} MiB]")
        os.pwrite(self.out, note.encode()[:MARK_BYTES - 1].ljust(MARK_BYTES - 1) + b"\n", head)
        with contextlib.suppress(OSError):
            tmp = f"{self.log}.cap.tmp"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                              0o600), "w") as f:
                json.dump({"dropped": self.cut, "cap": self.cap, "head": head}, f)
            os.replace(tmp, f"{self.log}.cap")

    def note(self, text: str) -> None:
        self.write(text.encode(errors="replace"))


# ---- main -------------------------------------------------------------------------------

def read_env(path: str | None) -> dict[str, str]:
    """The job's environment from the agent's file (removed once read)."""
    if not path:
        return {}
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        data = os.read(fd, ENV_FILE_LIMIT + 1)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
    env = json.loads(data)
    if len(data) > ENV_FILE_LIMIT or not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "\0" not in k + v and k and
            "=" not in k for k, v in env.items()):
        raise ValueError("bad environment file")
    return env


# ---- the job's bounds on its node (issue 26, item 3) ------------------------------------
#
# ``--max-procs N``: the job's processes at most (cgroup ``pids.max``; RLIMIT_NPROC of its
# account, set before the drop); ``--max-memory BYTES``: its host memory (cgroup
# ``memory.max``; RLIMIT_DATA, set before the drop); ``--io-weight W`` (cgroup ``io.weight``);
# ``--disk-budget BYTES`` over ``--disk-dirs`` (a JSON list: its checkpoint dir, its own
# files): measured every DISK_EVERY_S. A job at or past a bound is ended; its exit record
# says ``limit`` (a distinct end state, "over_limit" in the store).

BOUNDS_EVERY_S = 0.5
DISK_EVERY_S = 2.0
#: Most entries a disk measurement visits (a job's tree of a million empty files is bounded
#: by this, not by its size).
DISK_MAX_ENTRIES = 200_000


def bounds_of(args: dict[str, str]) -> dict[str, int]:
    """The bounds among the guard's options (absent: no bound)."""
    out = {}
    for key in ("max-procs", "max-memory", "io-weight", "disk-budget"):
        v = args.get(f"--{key}", "")
        if v.isdigit() and int(v) > 0:
            out[key] = int(v)
    return out


def data_limit(max_memory: int) -> int:
    """RLIMIT_DATA for a memory bound: a margin above it, so that the guard's sampler (which
    ends the job at the bound, a clear reason) usually acts first; the kernel's refusal is
    the hard stop for an allocation faster than the sampler."""
    return max_memory + max(max_memory // 8, 64 << 20)


@contextlib.contextmanager
def job_rlimits(bounds: dict[str, int]) -> Iterator[None]:
    """RLIMIT_NPROC and RLIMIT_DATA (:func:`data_limit`) lowered on this (root) guard while it
    starts the job, so the job inherits them from before the drop to its account; the guard's
    own are restored
    after (root is not bound by NPROC; DATA applies to it only for that moment).
    RLIMIT_NPROC counts every process of the account (its other jobs too). RLIMIT_AS is not
    used: CUDA reserves far more address space than memory."""
    import resource  # noqa: PLC0415 - stdlib, only when bounded

    saved = []
    for key, res in (("max-procs", resource.RLIMIT_NPROC), ("max-memory", resource.RLIMIT_DATA)):
        if key in bounds:
            old = resource.getrlimit(res)
            want = bounds[key] if key == "max-procs" else data_limit(bounds[key])
            lim = want if old[1] == resource.RLIM_INFINITY else min(want, old[1])
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(res, (lim, lim))
                saved.append((res, old))
    try:
        yield
    finally:
        for res, old in saved:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(res, old)


def limit_cgroup(path: str | None, home: str | None, bounds: dict[str, int]) -> list[str]:
    """Write the bounds to the attempt's cgroup where its controllers are available (asked of
    ``home``'s subtree first); returns the files written."""
    if path is None:
        return []
    if home is not None:
        for ctl in ("pids", "memory", "io"):
            with contextlib.suppress(OSError), \
                    open(os.path.join(home, "cgroup.subtree_control"), "w") as f:
                f.write(f"+{ctl}")
    done = []
    for key, name, value in (("max-procs", "pids.max", "{}"), ("max-memory", "memory.max", "{}"),
                             ("max-memory", "memory.swap.max", "0"),
                             ("io-weight", "io.weight", "default {}")):
        if key in bounds:
            try:
                with open(os.path.join(path, name), "w") as f:
                    f.write(value.format(bounds[key]))
                done.append(name)
            except OSError:
                pass
    return done


def _rss(pids: list[int]) -> int:
    size = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError), \
                open(f"/proc/{pid}/statm", "rb") as f:
            total += int(f.read(256).split()[1]) * size
    return total


def disk_used(dirs: list[str]) -> int:
    """Bytes allocated under ``dirs`` (the job's own: walked through directory fds, links
    never followed; at most DISK_MAX_ENTRIES entries)."""
    total, seen = 0, 0
    for d in dirs:
        with contextlib.suppress(OSError):
            for _top, dnames, fnames, dfd in os.fwalk(d, follow_symlinks=False):
                for name in (*dnames, *fnames):
                    seen += 1
                    with contextlib.suppress(OSError):
                        total += os.stat(name, dir_fd=dfd, follow_symlinks=False).st_blocks * 512
                if seen > DISK_MAX_ENTRIES:
                    return total
    return total


def over_bounds(bounds: dict[str, int], job_pid: int, cgroup: str | None) -> str:
    """Why the job is at or past its process or memory bound now, or ""."""
    if "max-procs" not in bounds and "max-memory" not in bounds:
        return ""
    pids = descendants(os.getpid())
    if "max-procs" in bounds and len(pids) >= bounds["max-procs"]:
        return f"processes: {len(pids)} reached its bound of {bounds['max-procs']}"
    if "max-memory" in bounds:
        used = _rss(pids)
        PEAK_RSS[0] = max(PEAK_RSS[0], used)
        if cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(cgroup, "memory.events")) as f:
                    ev = dict(line.split() for line in f if line.strip())
                if int(ev.get("oom_kill", "0")) > 0:
                    return f"host memory: killed by the kernel at {bounds['max-memory']} bytes"
        if used >= bounds["max-memory"]:
            return (f"host memory: {used / 2**30:.2f} GiB resident reached its bound of "
                    f"{bounds['max-memory'] / 2**30:.2f} GiB")
    return ""


#: The job's largest resident memory seen by :func:`over_bounds`.
PEAK_RSS = [0]


def limit_at_exit(bounds: dict[str, int], rc: int) -> str:
    """Why a job that failed by itself did so at its memory bound (its allocation refused by
    RLIMIT_DATA after the sampler saw it near the bound), or ""."""
    if rc == 0 or "max-memory" not in bounds:
        return ""
    import resource  # noqa: PLC0415 - stdlib, only when bounded

    # the kernel's peak of every reaped process of the job (the sampler may miss a fast one)
    peak = max(PEAK_RSS[0], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    if peak < 0.9 * bounds["max-memory"]:
        return ""
    return (f"host memory: failed at {peak / 2**30:.2f} GiB resident, at its bound of "
            f"{bounds['max-memory'] / 2**30:.2f} GiB")


def over_disk(bounds: dict[str, int], dirs: list[str]) -> str:
    """Why the job is past its disk budget now, or ""."""
    if "disk-budget" not in bounds or not dirs:
        return ""
    used = disk_used(dirs)
    if used > bounds["disk-budget"]:
        return (f"disk: {used / 2**20:.0f} MiB in its checkpoint dir and files, over its "
                f"budget of {bounds['disk-budget'] / 2**20:.0f} MiB")
    return ""


def write_limit_record(path: str | None, why: str, returncode: int | None = None) -> None:
    """The exit record of a job ended for a bound (``limit``: the reason)."""
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"returncode": returncode, "fenced": False, "why": why, "limit": why,
                       "time": time.time()}, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def in_child(guard_pid: int, cwd: str | None) -> None:
    """In the job's process before ``exec`` (after the drop to its account, which would clear
    it): die with the guard. A guard killed outright (SIGKILL, by anything) can end nothing
    itself; its job's main process then goes at once instead of running on unwatched beside
    the next attempt (issue 26, item 2)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != guard_pid:  # the guard died before the line above
        os._exit(137)
    if cwd:
        os.chdir(cwd)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: guard.py --lease-fd FD --agent-pid PID [--env-file F] [--exit-record F] "
              "-- CMD...", file=sys.stderr)
        return 2
    i = argv.index("--")
    opts, cmd = argv[:i], argv[i + 1:]
    args = dict(zip(opts[::2], opts[1::2], strict=False))
    lease, record = int(args.get("--lease-fd", "-1")), args.get("--exit-record")
    agent = int(args.get("--agent-pid", "0") or 0)
    gen_fd, gen = int(args.get("--generation-fd", "-1")), int(args.get("--generation", "0"))
    out = Output(-1, args.get("--log"), int(args.get("--log-cap", "0")))
    box: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []
    end: list[str] = []

    terminating: list[float] = []

    def forward(sig: int, _frame: object) -> None:
        if sig == signal.SIGTERM:
            terminating.append(time.time())
        if box:
            with contextlib.suppress(OSError):
                os.kill(box[0].pid, sig)
        else:
            pending.append(sig)

    def stop(_sig: int, _frame: object) -> None:
        end.append("killed")

    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    signal.signal(signal.SIGHUP, stop)
    try:
        env = read_env(args.get("--env-file"))
    except (OSError, ValueError) as e:
        out.note(f"miso: cannot read the job's environment: {e}\n")
        write_record(record, 127, False, str(e))
        return 127
    kw: dict[str, object] = {"umask": int(args.get("--umask", "63"))}
    if "--uid" in args:
        kw.update(user=int(args["--uid"]), group=int(args["--gid"]),
                  extra_groups=[int(g) for g in args.get("--groups", "").split(",") if g])
    cwd = args.get("--cwd")
    bounds = bounds_of(args)
    disk_dirs = [str(d) for d in json.loads(args.get("--disk-dirs", "[]")) if d]
    if gen_fd >= 0 and replaced(gen_fd, gen):  # a newer agent took the node: never start
        out.note("miso: not starting this job (agent replaced)\n")
        write_record(record, None, True, "agent replaced")
        return 137
    tracker = Tracker()
    limit_cgroup(tracker.cgroup, tracker.home, bounds)
    tracker.enter()
    try:
        # the working directory is entered after the drop to the job's account
        # The job starts with the checkpoint signal blocked (the mask survives exec): one
        # that comes before miso.job is imported (a slow `import torch`) stays pending, and
        # the helper unblocks it once its handler is in place, so it never kills the job.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        guard_pid = os.getpid()
        try:
            with job_rlimits(bounds):
                child = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=env,
                    preexec_fn=lambda: in_child(guard_pid, cwd),
                    **kw)  # type: ignore[call-overload]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except (OSError, subprocess.SubprocessError) as e:
        tracker.leave()
        tracker.close()
        out.note(f"miso: cannot start {cmd[0] if cmd else ''!r}: {e}\n")
        write_record(record, 127, False, str(e))
        return 127
    tracker.leave()
    box.append(child)
    for sig in pending:
        forward(sig, None)
    assert child.stdout is not None
    out.fd = child.stdout.fileno()
    status: list[int] = []

    def reap() -> None:
        """Collect every exited child (orphans reparented to this subreaper too)."""
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == child.pid:
                status.append(os.waitstatus_to_exitcode(st))
                child.returncode = status[-1]

    open_pipe = True
    last_check = 0.0
    fenced, why = False, ""
    limit, next_bounds, next_disk = "", 0.0, 0.0
    while True:
        if open_pipe:
            open_pipe = out.pump(POLL_S)
        reap()
        if status:
            drain_until = time.time() + 1.0  # the rest of its output; a leftover that holds
            while open_pipe and time.time() < drain_until:  # the pipe open is killed below
                open_pipe = bool(select.select([out.fd], [], [], 0)[0]) and out.pump(0.0)
            break
        if end:
            why = "killed"
            break
        if not open_pipe:
            time.sleep(POLL_S)
        if time.time() - last_check < POLL_S:
            continue
        last_check = time.time()
        until = lease_until(lease) if lease >= 0 else None
        why = "lease expired" if until is not None and time.time() > until else \
            "agent died" if agent and not terminating and not alive(agent) else \
            "agent replaced" if gen_fd >= 0 and replaced(gen_fd, gen) else ""
        if why:
            out.note(f"miso: fencing this job ({why})\n")
            fenced = True
            write_record(record, None, True, why)
            break
        if bounds and time.time() >= next_bounds:
            next_bounds = time.time() + BOUNDS_EVERY_S
            limit = over_bounds(bounds, child.pid, tracker.cgroup)
            if not limit and time.time() >= next_disk:
                next_disk = time.time() + DISK_EVERY_S
                limit = over_disk(bounds, disk_dirs)
            if limit:
                why = f"over its limit: {limit}"
                out.note(f"miso: ending this job: {why}\n")
                write_limit_record(record, limit)
                break
    exited = bool(status)  # the job's main process ended by itself
    left = tracker.kill_all(reap)
    tracker.close()
    if left:
        out.note(f"miso: {left} process(es) of this job could not be killed\n")
    if not exited:
        if not fenced and not limit:
            write_record(record, None, False, why)
        return 137
    rc = status[0]
    limit = limit_at_exit(bounds, rc)
    if limit:
        out.note(f"miso: this job failed at its limit: {limit}\n")
        write_limit_record(record, limit, rc)
    else:
        write_record(record, rc, False, "")
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
