"""Reading a job's (capped) log from its end: ``miso logs --tail N`` costs O(N lines), not
O(file), and the reader's memory does not grow with the log.

The guard caps each attempt's log (:class:`miso.agent.output.Output`); when it has dropped
bytes from the middle it leaves ``<log>.cap`` (``{"dropped", "cap", "head"}``), which
:func:`cap_note` turns into the line ``miso logs`` prints above the attempt's lines.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from miso.agent import runas

#: Most bytes read back for one attempt (a job may write one endless line).
MAX_TAIL_BYTES = 4 << 20
BLOCK = 64 << 10


def tail_lines(path: str | Path, n: int, *, max_bytes: int = MAX_TAIL_BYTES) -> list[str]:
    """The last ``n`` lines of a log (fewer when they hold more than ``max_bytes``); a
    symlink, FIFO or device is not read. Raises OSError when the file cannot be opened."""
    if n <= 0:
        return []
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        end = os.lseek(fd, 0, os.SEEK_END)
        pos, chunks, newlines = end, [], 0
        while pos > 0 and newlines <= n and end - pos < max_bytes:
            size = min(BLOCK, pos, max_bytes - (end - pos))
            pos -= size
            chunk = os.pread(fd, size, pos)
            chunks.append(chunk)
            newlines += chunk.count(b"\n")
    finally:
        os.close(fd)
    data = b"".join(reversed(chunks))
    lines = data.decode(errors="replace").splitlines()
    if pos > 0 and lines:
        lines = lines[1:]  # the first one is cut
    return [ln.rstrip() if ln.startswith("[miso: ") else ln for ln in lines[-n:]]


def cap_note(path: str | Path) -> str | None:
    """The line saying how much of a capped log was dropped, or None when nothing was."""
    info = runas.read_json(f"{path}.cap", limit=4096)
    if not isinstance(info, dict):
        return None
    dropped, cap = info.get("dropped"), info.get("cap")
    if not isinstance(dropped, int) or not isinstance(cap, int) or dropped <= 0:
        return None
    return (f"[miso: {dropped} bytes dropped from the middle of this log; "
            f"cap {cap / (1 << 20):g} MiB]")


def attempt_lines(path: str | Path, tail: int) -> list[str]:
    """``tail`` last lines of one attempt's log, after the cap note when bytes were dropped."""
    lines = tail_lines(path, tail)
    note = cap_note(path)
    if note is not None and note not in lines:
        lines.insert(0, note)
    return lines
