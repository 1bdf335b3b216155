"""The decision log: explanation records appended to a JSONL file, plus the recent ones in memory.

One JSON object per line (see :mod:`miso.observe.decisions` for the fields, and
``docs/observe.md``), each with a ``seq`` number increasing within the file. The live
controller writes ``<state dir>/decisions.jsonl`` (mode 0600); ``miso simulate --events FILE``
writes the same records. :func:`read_records` filters a file by job, GPU and time; a torn last
line (a crash mid-write) is skipped. The file is rotated once it passes ``max_bytes`` (default
64 MiB): the full file becomes ``decisions.jsonl.1`` (replacing the previous one), so the log
keeps between one and two files' worth of the latest records; readers read both, oldest first.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from miso.observe.decisions import mentions

LOG_NAME = "decisions.jsonl"
MAX_BYTES = 64 << 20


class DecisionLog:
    """Append-only record log; ``path=None`` keeps records in memory only.

    Thread-safe: the controller loop appends, HTTP handlers read :meth:`recent`.
    """

    def __init__(self, path: str | Path | None = None, *, keep: int = 500,
                 extra: Mapping[str, Any] | None = None, flush: bool = True,
                 max_bytes: int = MAX_BYTES) -> None:
        """``flush``: write each record through at once (the live log; a simulator's log can
        buffer and is complete once :meth:`close` ran)."""
        self.path = Path(path) if path is not None else None
        self.flush = flush
        self.max_bytes = max_bytes
        self._size = 0
        self.extra = dict(extra or {})
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._seq = 0
        self._held = 0  # open :meth:`batch` blocks: records are flushed when the last ends
        self._fh: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._seq = max(_last_seq(rotated(self.path)), _last_seq(self.path))
            self._open()

    def _open(self) -> None:
        assert self.path is not None
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._fh = os.fdopen(fd, "a", encoding="utf-8")
        self._size = self.path.stat().st_size
        if _torn(self.path):
            self._fh.write("\n")  # end a line a crash cut short: it stays unreadable
            self._size += 1

    def _rotate(self) -> None:
        assert self.path is not None and self._fh is not None
        self._fh.close()
        os.replace(self.path, rotated(self.path))
        self._open()

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        """Store one record (adds ``seq`` and the log's extra fields); returns it."""
        with self._lock:
            self._seq += 1
            out = {"seq": self._seq, **self.extra, **rec}
            self._recent.append(out)
            if self._fh is not None:
                line = json.dumps(out, separators=(",", ":")) + "\n"
                if self._size and self._size + len(line) > self.max_bytes:
                    self._rotate()
                self._fh.write(line)
                self._size += len(line)
                if self.flush and not self._held:
                    self._fh.flush()
        return out

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Records appended inside are flushed once, at the end, not one by one: a flush is
        a system call, and one turn of a thousand-GPU controller's loop (a re-plan of every
        GPU) appends a thousand records."""
        with self._lock:
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1
                if not self._held and self.flush and self._fh is not None:
                    self._fh.flush()

    def recent(self, n: int | None = None, *, job: str | None = None, gpu: str | None = None,
               since: float | None = None) -> list[dict[str, Any]]:
        """The last ``n`` records kept in memory that match (oldest first)."""
        with self._lock:
            recs = list(self._recent)
        out = [r for r in recs if _match(r, job, gpu, since)]
        return out[-n:] if n else out

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def _match(r: Mapping[str, Any], job: str | None, gpu: str | None,
           since: float | None) -> bool:
    if since is not None and float(r.get("time", 0.0)) < since:
        return False
    return mentions(r, job=job, gpu=gpu)


def rotated(path: str | Path) -> Path:
    """Where a log's previous file goes when it is rotated."""
    p = Path(path)
    return p.with_name(p.name + ".1")


def iter_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every well-formed record of a log (its rotated file first, if any), in order; torn
    lines are skipped."""
    old = rotated(path)
    if old.exists():
        yield from _iter_file(old)
    yield from _iter_file(Path(path))


#: A decision record is a few KiB; a longer line means the file is not a decision log.
MAX_RECORD_BYTES = 4 << 20


class LogError(ValueError):
    """The file is not a decision log (not a regular file, a line too long or too deep)."""


def _iter_file(path: Path) -> Iterator[dict[str, Any]]:
    if path.exists() and not path.is_file():
        raise LogError(f"{path} is not a regular file, so not a decision log")
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(iter(lambda: fh.readline(MAX_RECORD_BYTES + 1), ""), 1):
            if len(line) > MAX_RECORD_BYTES:
                raise LogError(f"{path}: line {n} is over {MAX_RECORD_BYTES >> 20} MiB, so "
                               f"the file is not a decision log")
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line (a crash mid-write) is skipped
            except RecursionError:
                raise LogError(f"{path}: line {n} nests too deeply, so the file is not a "
                               f"decision log") from None
            if isinstance(rec, dict):
                yield rec


def read_records(path: str | Path, *, job: str | None = None, gpu: str | None = None,
                 since: float | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Records of ``path`` that match; with ``limit`` only the last ``limit`` of them."""
    keep: deque[dict[str, Any]] | list[dict[str, Any]] = deque(maxlen=limit) if limit else []
    for r in iter_records(path):
        if _match(r, job, gpu, since):
            keep.append(r)
    return list(keep)


def _torn(path: Path) -> bool:
    """True when the file is not empty and does not end with a newline."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def _last_seq(path: Path) -> int:
    if not path.exists():
        return 0
    last = 0
    for r in _iter_file(path):
        s = r.get("seq")
        if isinstance(s, int) and s > last:
            last = s
    return last
