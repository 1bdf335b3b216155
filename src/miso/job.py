"""Job-side helper: report progress, save and exit when asked to checkpoint, resume.

A training script run by miso may use this module; scripts that do not still run (they only
restart from zero after a repartition). Typical use::

    from miso import job

    ctx = job.context()
    state = ctx.load() or {"iteration": 0}        # resume from the path miso gives, if any
    for it in range(state["iteration"], total):
        train_one_step()
        ctx.report(it + 1, total)                 # cheap; written at most every 0.1 s
        if ctx.checkpoint_requested():            # SIGUSR1 or the flag file
            ctx.save_json({"iteration": it + 1}, iteration=it + 1)
            ctx.exit_checkpointed()               # exit code 75: "saved, stopped on request"

For framework checkpoints write to :attr:`JobContext.checkpoint_path` yourself and call
:meth:`JobContext.mark_saved`.

Environment (set by the agent): ``MISO_JOB_ID``, ``MISO_ATTEMPT``, ``MISO_NODE``,
``MISO_PROGRESS_FILE`` (JSON progress written here), ``MISO_CHECKPOINT_DIR``,
``MISO_RESUME_FROM`` (checkpoint to resume from) and ``MISO_CHECKPOINT_FLAG`` (file whose
existence asks for a checkpoint). A job on several GPUs (a gang) runs one process per GPU
with torch.distributed's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``: every rank uses this helper the same way (all load the same checkpoint, all
exit 75 when asked), and only rank 0 writes progress and checkpoints (:attr:`JobContext.writer`;
the other ranks' writes are no-ops). Ranks must stop at the same step: agree on a request
first (e.g. ``all_reduce`` of ``checkpoint_requested()`` as an int with MAX). The agent's
guard process kills the job when its node is fenced or its agent dies, so no orphans survive
a lost node.

A checkpoint request never kills a job that uses this helper, whenever it comes: the guard
starts the job with ``SIGUSR1`` blocked (a request during a slow ``import torch`` waits),
importing this module installs the handler and unblocks it, and from the first atexit hook
on (and after :meth:`JobContext.exit_checkpointed`) the signal is ignored, so interpreter
shutdown cannot turn it (or ``SIGTERM`` after a save) into a death by signal. A program
that does not use the helper and wants ``SIGUSR1`` itself unblocks it (the flag file
``MISO_CHECKPOINT_FLAG`` is always written too).

The helper never lets a storage error reach the training loop: a progress write that fails
(e.g. the disk is full) is retried at the next :meth:`JobContext.report`; :meth:`save_json`
that cannot write returns None (the job goes on; miso resumes it from the previous save).
Every completed save is also recorded next to the checkpoint (``.miso/last-checkpoint.json``),
so a controller that lost its store still resumes the job from it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

#: Exit code of a job that saved a checkpoint and stopped because miso asked it to.
EXIT_CHECKPOINTED = 75
#: Signal the agent sends to ask for a checkpoint (the flag file is the fallback).
CHECKPOINT_SIGNAL = signal.SIGUSR1
#: Name of the record of the last completed save, inside ``MISO_CHECKPOINT_DIR/.miso``.
LAST_CHECKPOINT = "last-checkpoint.json"
#: The file :meth:`JobContext.save_json` writes (the controller's fallback resume point).
JSON_CHECKPOINT = "checkpoint.json"


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON so readers never see a partial file (temp file + rename)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def last_checkpoint(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """The record ``{"iteration", "path", "time", "attempt"}`` of the last completed save in
    ``checkpoint_dir``, or None. The controller reads it, and the job wrote it: anything but
    a small regular file with a path (no NUL, at most 4096 characters) and a whole
    ``iteration`` (or none) is no record."""
    from miso import jobpaths  # noqa: PLC0415 - root's side only; jobs import this module

    # through directory fds: ``.miso`` may be the job's link to a root-only dir
    data = jobpaths.read_json_in(checkpoint_dir, [".miso"], LAST_CHECKPOINT, 1 << 16)
    if not isinstance(data, dict):
        return None
    path, it = data.get("path"), data.get("iteration")
    if not isinstance(path, str) or not path or len(path) > 4096 or "\0" in path:
        return None
    if it is not None and (isinstance(it, bool) or not isinstance(it, int)
                           or not 0 <= it < 2 ** 53):
        return None
    return data


def read_json(path: str | Path, limit: int | None = None) -> Any | None:
    """Read a JSON file, or None when missing or unreadable. Only a regular file, never
    through a symlink (a FIFO would block the reader), at most ``limit`` bytes if given."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read() if limit is None else f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


class _RequestFlag:
    """Whether a checkpoint request came: set from a signal handler, so it takes no lock.

    ``threading.Event.set`` takes one, and Python runs a signal's handler inside another's
    when a second signal comes meanwhile: a job sent SIGTERM twice at once (the node's
    ``kill`` of every process and the guard's forwarding) waited on its own lock forever,
    and the guard fenced it when the lease ran out. One attribute store is atomic."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


#: Set by a checkpoint request (SIGUSR1, or SIGTERM under miso) since this module was imported.
_REQUESTED = _RequestFlag()


def _on_request(_sig: int, _frame: object) -> None:
    _REQUESTED.set()


def _quiet_at_exit() -> None:
    """From interpreter shutdown on, a checkpoint request (or a SIGTERM under miso) has
    nothing left to save: ignore it rather than die of it (CPython restores default
    handlers late in shutdown, but keeps an ignored signal ignored)."""
    with contextlib.suppress(ValueError, OSError):
        signal.signal(CHECKPOINT_SIGNAL, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _install_early() -> None:
    """At import: catch the checkpoint signal, then unblock it (the guard starts jobs with it
    blocked), so a request that came before now is delivered to the handler. Only in a job
    miso runs (``MISO_PROGRESS_FILE`` set): importing this module elsewhere (the agent, a
    test) changes nothing."""
    if not os.environ.get("MISO_PROGRESS_FILE") or \
            threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(CHECKPOINT_SIGNAL) in (signal.SIG_DFL, None):
            signal.signal(CHECKPOINT_SIGNAL, _on_request)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {CHECKPOINT_SIGNAL})
    atexit.register(_quiet_at_exit)


_install_early()


class JobContext:
    """The running job's view of miso (all methods are no-ops outside miso)."""

    def __init__(self, env: dict[str, str] | None = None, *, install_signal: bool = True) -> None:
        e = dict(os.environ if env is None else env)
        self.job_id = e.get("MISO_JOB_ID", "")
        self.attempt = int(e.get("MISO_ATTEMPT", "0") or 0)
        self.progress_file = e.get("MISO_PROGRESS_FILE") or None
        self.checkpoint_dir = e.get("MISO_CHECKPOINT_DIR") or None
        self.resume_path = e.get("MISO_RESUME_FROM") or None
        self.flag_file = e.get("MISO_CHECKPOINT_FLAG") or None
        #: torch.distributed rank and world size of a gang's process (0 and 1 alone)
        self.rank = _int_env(e, "RANK", 0)
        self.local_rank = _int_env(e, "LOCAL_RANK", 0)
        self.world_size = max(1, _int_env(e, "WORLD_SIZE", 1))
        self._requested = _REQUESTED if install_signal else _RequestFlag()
        self._last_write = 0.0
        self._state: dict[str, Any] = {
            "job": self.job_id, "attempt": self.attempt, "pid": os.getpid(),
            "iteration": 0, "total": None, "time": time.time(), "checkpoint": None,
            "start_iteration": None, "done": False, "helper": 1,
        }
        #: Storage errors the helper absorbed (progress or checkpoint writes that failed).
        self.io_errors = 0
        if install_signal and threading.current_thread() is threading.main_thread():
            signal.signal(CHECKPOINT_SIGNAL, _on_request)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {CHECKPOINT_SIGNAL})
            if self.managed:
                # SIGTERM under miso means the node is going away (scancel, systemctl stop, a
                # pod's deletion): save and exit 75 like a checkpoint request, within the
                # grace period before SIGKILL (docs/deploy.md).
                signal.signal(signal.SIGTERM, _on_request)

    @property
    def writer(self) -> bool:
        """This process writes progress and checkpoints (rank 0 of a gang; a lone job)."""
        return self.rank == 0

    @property
    def managed(self) -> bool:
        """True when running under a miso agent."""
        return self.progress_file is not None

    @property
    def checkpoint_path(self) -> str | None:
        """Default file for a framework's checkpoint (``torch.save``; inside
        ``MISO_CHECKPOINT_DIR``, no extension: any format). :meth:`save_json` writes
        ``checkpoint.json`` beside it."""
        return str(Path(self.checkpoint_dir) / "checkpoint") if self.checkpoint_dir else None

    # ---- resume / save ------------------------------------------------------------------

    def load(self) -> dict[str, Any] | None:
        """The JSON checkpoint to resume from (``MISO_RESUME_FROM``), or None."""
        if not self.resume_path:
            return None
        data = read_json(self.resume_path)
        return data if isinstance(data, dict) else None

    def save_json(self, state: dict[str, Any], *, iteration: int) -> str | None:
        """Save ``state`` atomically to ``checkpoint.json`` in the checkpoint directory and
        record it as done.

        Returns the path, or None when there is nowhere to save or the write failed (the
        previous checkpoint stays the one miso resumes from). A rank other than 0 of a gang
        writes nothing and returns None (rank 0 saves the state every rank holds)."""
        if not self.checkpoint_dir or not self.writer:
            return None
        path = str(Path(self.checkpoint_dir) / JSON_CHECKPOINT)
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, state)
        except OSError as e:
            self._io_error("checkpoint", e)
            return None
        self.mark_saved(path, iteration=iteration)
        return path

    def mark_saved(self, path: str, *, iteration: int) -> None:
        """Tell miso a checkpoint at ``iteration`` is complete at ``path`` (rank 0 only)."""
        if not self.writer:
            return
        ck = {"iteration": int(iteration), "path": str(path), "time": time.time(),
              "attempt": self.attempt}
        self._state["checkpoint"] = ck
        if self.checkpoint_dir:
            try:
                (Path(self.checkpoint_dir) / ".miso").mkdir(parents=True, exist_ok=True)
                write_json_atomic(Path(self.checkpoint_dir) / ".miso" / LAST_CHECKPOINT, ck)
            except OSError as e:
                self._io_error("checkpoint record", e)
        self._flush(force=True)

    def _io_error(self, what: str, e: OSError) -> None:
        self.io_errors += 1
        if self.io_errors <= 3 or self.io_errors % 100 == 0:
            with contextlib.suppress(Exception):
                print(f"miso.job: {what} write failed ({e}); continuing", file=sys.stderr,
                      flush=True)

    # ---- progress -----------------------------------------------------------------------

    def started(self, iteration: int, total: int | None = None, *,
                checkpointable: bool = True) -> None:
        """Record where this attempt starts (after loading a checkpoint). A job that reports
        progress but cannot save it says ``checkpointable=False``: miso then never moves it
        once it runs (a restart would throw its progress away)."""
        self._state["start_iteration"] = int(iteration)
        self._state["checkpointable"] = bool(checkpointable)
        self.report(iteration, total, force=True)

    def report(self, iteration: int, total: int | None = None, *, force: bool = False,
               **extra: Any) -> None:
        """Record progress (iterations done); written at most every 0.1 s unless ``force``."""
        self._state["iteration"] = int(iteration)
        if total is not None:
            self._state["total"] = int(total)
        if self._state["start_iteration"] is None:
            self._state["start_iteration"] = int(iteration)
        self._state.update(extra)
        self._flush(force=force)

    def finish(self) -> None:
        """Record that the job completed (write the final progress)."""
        self._state["done"] = True
        self._flush(force=True)

    def _flush(self, *, force: bool) -> None:
        if self.progress_file is None or not self.writer:
            return
        now = time.time()
        if not force and now - self._last_write < 0.1:
            return
        self._state["time"] = now
        self._last_write = now
        try:
            write_json_atomic(self.progress_file, self._state)
        except OSError as e:  # e.g. ENOSPC: the next report tries again
            self._last_write = 0.0
            self._io_error("progress", e)

    # ---- checkpoint requests ------------------------------------------------------------

    def checkpoint_requested(self) -> bool:
        """True once miso asked this job to save and stop."""
        if not self._requested.is_set() and self.flag_file and os.path.exists(self.flag_file):
            self._requested.set()
        return self._requested.is_set()

    def exit_checkpointed(self) -> NoReturn:
        """Exit with :data:`EXIT_CHECKPOINTED` after a requested checkpoint. The work is
        saved: a later checkpoint request or SIGTERM (during interpreter shutdown) is
        ignored, so the exit code stays 75."""
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(CHECKPOINT_SIGNAL, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._flush(force=True)
        sys.stdout.flush()
        sys.exit(EXIT_CHECKPOINTED)


def _int_env(env: dict[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, "") or default)
    except ValueError:
        return default


_CTX: JobContext | None = None


def context() -> JobContext:
    """The process-wide :class:`JobContext` (created on first use)."""
    global _CTX
    if _CTX is None:
        _CTX = JobContext()
    return _CTX
