"""One owner per state directory: an exclusive ``flock`` the OS drops when its holder dies.

The holder writes its PID into the lock file, so a second would-be owner can say who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class StateDirLocked(RuntimeError):
    """Another live process holds the lock."""


class StateDirLock:
    """Exclusive lock on ``<state_dir>/<name>``; :meth:`acquire` raises
    :class:`StateDirLocked` naming the holder's PID."""

    def __init__(self, state_dir: str | Path, name: str = "controller.lock",
                 what: str = "a miso controller") -> None:
        self.path = Path(state_dir) / name
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> StateDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = self.holder()
            who = f"PID {pid}" if pid else "another process"
            raise StateDirLocked(
                f"state directory {self.path.parent} is in use by {self.what} ({who}); stop "
                f"it first (miso cluster down --state-dir {self.path.parent})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def holder(self) -> int | None:
        """PID of the live holder, or None when nobody holds the lock."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 32, 0).decode(errors="replace").strip()
                return int(text) if text.isdigit() else -1
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
