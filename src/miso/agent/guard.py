"""Fence for one job attempt: runs the job as its child and kills it when the node is fenced.

``python guard.py --lease-fd FD --agent-pid PID [--exit-record FILE] [--umask N]
[--uid N --gid N --groups N,N] -- COMMAND...``

The guard runs as the agent; the job runs with ``--umask`` and, when given, as the account
``--uid``/``--gid``/``--groups``.

The agent starts every job through this guard (stdlib only, so it starts fast). The guard

* forwards the checkpoint signal (``SIGUSR1``) and ``SIGTERM`` to the job; after a SIGTERM
  (the node is going away: its agent dies with it) it no longer fences on the agent's death,
  only on the lease, so a job that saves on SIGTERM (:mod:`miso.job`) can finish saving;
* kills the whole process group (the job and its children) when the controller's lease has
  run out (the lease file, open as descriptor ``FD``, holds the lease's end in seconds since
  the epoch, written by the agent on every renewal) or the agent has died - so a hung or
  partitioned node stops its jobs before the controller, which waits the lease out, starts
  them elsewhere;
* on exit writes ``{"returncode", "fenced", "time"}`` to the exit record (in the agent's
  attempt directory, under the shared state directory: the controller reads it even when the
  node is unreachable), so a job that finished on a lost node is never run again;
* copies the job's output (stdout and stderr, through a pipe) to its own stdout, the
  attempt's log: a write that fails (the disk is full) drops that output, never the job - a
  job writing straight to a full log file would die of ENOSPC on its next ``print``;
* exits with the job's exit code (128 + N when the job died of signal N).

An empty lease file (an agent no controller ever leased) means no fencing.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.1


def lease_until(fd: int) -> float | None:
    """The lease end in the file open as ``fd``, or None when there is none (or it cannot be
    read now)."""
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        return float(text) if text else None
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


class Output:
    """Copies the job's pipe to fd 1; a failed write drops the data (and says so later)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.dropped = 0

    def pump(self, timeout: float) -> bool:
        """Copy what is there within ``timeout`` s; False at end of file."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        data = os.read(self.fd, 65536)
        if not data:
            return False
        if self.dropped:
            data = f"[miso: {self.dropped} bytes of output lost: disk full?]\n".encode() + data
        try:
            os.write(1, data)
            self.dropped = 0
        except OSError:
            self.dropped += len(data)
        return True


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: guard.py --lease-fd FD --agent-pid PID [--exit-record FILE] -- CMD...",
              file=sys.stderr)
        return 2
    i = argv.index("--")
    opts, cmd = argv[:i], argv[i + 1:]
    args = dict(zip(opts[::2], opts[1::2], strict=False))
    lease, record = int(args.get("--lease-fd", "-1")), args.get("--exit-record")
    agent = int(args.get("--agent-pid", "0") or 0)
    box: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    terminating: list[float] = []

    def forward(sig: int, _frame: object) -> None:
        if sig == signal.SIGTERM:
            terminating.append(time.time())
        if box:
            box[0].send_signal(sig)
        else:
            pending.append(sig)

    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    kw: dict[str, object] = {"umask": int(args.get("--umask", "63"))}
    if "--uid" in args:
        kw.update(user=int(args["--uid"]), group=int(args["--gid"]),
                  extra_groups=[int(g) for g in args.get("--groups", "").split(",") if g])
    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 **kw)  # type: ignore[call-overload]
    except OSError as e:
        print(f"miso: cannot start {cmd[0] if cmd else ''!r}: {e}", file=sys.stderr)
        write_record(record, 127, False, str(e))
        return 127
    box.append(child)
    for sig in pending:
        child.send_signal(sig)
    assert child.stdout is not None
    out = Output(child.stdout.fileno())
    open_pipe = True
    last_check = 0.0
    while True:
        if open_pipe:
            open_pipe = out.pump(POLL_S)
        rc = child.poll()
        if rc is not None:
            while open_pipe:  # the rest of its output
                open_pipe = out.pump(0.0) and bool(select.select([out.fd], [], [], 0)[0])
            break
        if not open_pipe:
            time.sleep(POLL_S)
        if time.time() - last_check < POLL_S:
            continue
        last_check = time.time()
        until = lease_until(lease) if lease >= 0 else None
        why = "lease expired" if until is not None and time.time() > until else \
            "agent died" if agent and not terminating and not alive(agent) else ""
        if why:
            print(f"miso: fencing this job ({why})", file=sys.stderr, flush=True)
            write_record(record, None, True, why)
            os.killpg(os.getpgrp(), signal.SIGKILL)
    write_record(record, rc, False, "")
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
