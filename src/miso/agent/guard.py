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
child. This module and its siblings :mod:`~miso.agent.jobprocs` (the job's processes),
:mod:`~miso.agent.limits` (its bounds) and :mod:`~miso.agent.output` (its capped log) are
stdlib only (they cannot import miso under ``-I``; they also start fast).

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

try:  # a module of miso (the agent and tests read its helpers)
    from miso.agent.jobprocs import Tracker, alive, descendants, end_cgroup, own_cgroup
    from miso.agent.limits import (
        BOUNDS_EVERY_S,
        DISK_EVERY_S,
        bounds_of,
        job_rlimits,
        limit_at_exit,
        limit_cgroup,
        over_bounds,
        over_disk,
        write_limit_record,
    )
    from miso.agent.output import Output
except ImportError:  # the guard itself: ``python -I -S guard.py`` cannot import miso; its
    # stdlib-only siblings, by path (this root-owned directory, nothing a job can write)
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from jobprocs import (  # type: ignore[no-redef]
        Tracker,
        alive,
        descendants,
        end_cgroup,
        own_cgroup,
    )
    from limits import (  # type: ignore[no-redef]
        BOUNDS_EVERY_S,
        DISK_EVERY_S,
        bounds_of,
        job_rlimits,
        limit_at_exit,
        limit_cgroup,
        over_bounds,
        over_disk,
        write_limit_record,
    )
    from output import Output  # type: ignore[no-redef]

#: Re-exported for the agent and the tests (the job's processes: :mod:`miso.agent.jobprocs`).
__all__ = ["alive", "descendants", "end_cgroup", "main", "own_cgroup"]

POLL_S = 0.1
PR_SET_PDEATHSIG = 1
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


def told_to_end(terminating: list[float]) -> bool:
    """Whether a SIGTERM reached this guard. Asked after the agent was found dead, in a frame
    of its own: the node's SIGTERM (sent before the agent dies) is delivered at the latest on
    the return from the liveness check's system call, and CPython runs a pending signal's
    handler when a function starts, so a guard preempted between the two reads cannot fence a
    job that is saving on SIGTERM."""
    return bool(terminating)


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
            "agent died" if agent and not alive(agent) and not told_to_end(terminating) else \
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
