"""The guard's copy of a job's output (its pipe) to the attempt's log, capped: past the cap
the log keeps its first quarter and last half with one line saying how many bytes were
dropped from the middle (and ``<log>.cap``, a small JSON the agent reads,
:mod:`miso.agent.logfile`); a write that fails (the disk is full) drops that output, never
the job.

Stdlib only: the guard (:mod:`miso.agent.guard`) imports it in its isolated interpreter
(``python -I -S``), where miso cannot be imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import select

#: Bytes of the note that replaces the middle of a capped log (fixed: rewritten in place).
MARK_BYTES = 100


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
