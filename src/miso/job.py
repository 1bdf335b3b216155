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

Environment (set by the agent): ``MISO_JOB_ID``, ``MISO_ATTEMPT``, ``MISO_PROGRESS_FILE``
(JSON progress written here), ``MISO_CHECKPOINT_DIR``, ``MISO_RESUME_FROM`` (checkpoint to
resume from), ``MISO_CHECKPOINT_FLAG`` (file whose existence asks for a checkpoint) and
``MISO_AGENT_PID`` (the job exits if its agent dies, so no orphans survive a lost node).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

#: Exit code of a job that saved a checkpoint and stopped because miso asked it to.
EXIT_CHECKPOINTED = 75
#: Signal the agent sends to ask for a checkpoint (the flag file is the fallback).
CHECKPOINT_SIGNAL = signal.SIGUSR1


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON so readers never see a partial file (temp file + rename)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, p)


def read_json(path: str | Path) -> Any | None:
    """Read a JSON file, or None when missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


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
        self._requested = threading.Event()
        self._last_write = 0.0
        self._state: dict[str, Any] = {
            "job": self.job_id, "attempt": self.attempt, "pid": os.getpid(),
            "iteration": 0, "total": None, "time": time.time(), "checkpoint": None,
            "start_iteration": None, "done": False,
        }
        if install_signal and threading.current_thread() is threading.main_thread():
            signal.signal(CHECKPOINT_SIGNAL, lambda *_: self._requested.set())
        agent = e.get("MISO_AGENT_PID")
        if agent and agent.isdigit():
            threading.Thread(target=self._watch_agent, args=(int(agent),), daemon=True).start()

    @property
    def managed(self) -> bool:
        """True when running under a miso agent."""
        return self.progress_file is not None

    @property
    def checkpoint_path(self) -> str | None:
        """Default file to save a checkpoint to (inside ``MISO_CHECKPOINT_DIR``)."""
        return str(Path(self.checkpoint_dir) / "checkpoint.json") if self.checkpoint_dir else None

    # ---- resume / save ------------------------------------------------------------------

    def load(self) -> dict[str, Any] | None:
        """The JSON checkpoint to resume from (``MISO_RESUME_FROM``), or None."""
        if not self.resume_path:
            return None
        data = read_json(self.resume_path)
        return data if isinstance(data, dict) else None

    def save_json(self, state: dict[str, Any], *, iteration: int) -> str | None:
        """Save ``state`` atomically to :attr:`checkpoint_path` and record it as done."""
        path = self.checkpoint_path
        if path is None:
            return None
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, state)
        self.mark_saved(path, iteration=iteration)
        return path

    def mark_saved(self, path: str, *, iteration: int) -> None:
        """Tell miso a checkpoint at ``iteration`` is complete at ``path``."""
        self._state["checkpoint"] = {"iteration": int(iteration), "path": str(path),
                                     "time": time.time()}
        self._flush(force=True)

    # ---- progress -----------------------------------------------------------------------

    def started(self, iteration: int, total: int | None = None) -> None:
        """Record where this attempt starts (after loading a checkpoint)."""
        self._state["start_iteration"] = int(iteration)
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
        if self.progress_file is None:
            return
        now = time.time()
        if not force and now - self._last_write < 0.1:
            return
        self._state["time"] = now
        self._last_write = now
        write_json_atomic(self.progress_file, self._state)

    # ---- checkpoint requests ------------------------------------------------------------

    def checkpoint_requested(self) -> bool:
        """True once miso asked this job to save and stop."""
        if not self._requested.is_set() and self.flag_file and os.path.exists(self.flag_file):
            self._requested.set()
        return self._requested.is_set()

    def exit_checkpointed(self) -> NoReturn:
        """Exit with :data:`EXIT_CHECKPOINTED` after a requested checkpoint."""
        self._flush(force=True)
        sys.stdout.flush()
        sys.exit(EXIT_CHECKPOINTED)

    def _watch_agent(self, pid: int) -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(70)  # the agent is gone: do not outlive it
            except PermissionError:
                pass


_CTX: JobContext | None = None


def context() -> JobContext:
    """The process-wide :class:`JobContext` (created on first use)."""
    global _CTX
    if _CTX is None:
        _CTX = JobContext()
    return _CTX
