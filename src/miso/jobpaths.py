"""Reading what a job wrote in its own directories, as root, without following its links.

A job owns its checkpoint dir: any component below it may be a symlink to a root-only place.
``O_NOFOLLOW`` guards only the last component of a path, so each component is opened on its
own (``O_NOFOLLOW|O_DIRECTORY`` relative to the previous one's fd, i.e. ``openat``); a link
anywhere is no file. See docs/security.md.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def inside(base: str | Path, path: str | Path) -> list[str] | None:
    """The components of ``path`` below ``base`` (lexically: absolute, normalised, no
    ``..`` out of it), or None when it does not lie strictly inside ``base``."""
    b, p = os.path.normpath(str(base)), str(path)
    if "\0" in p or not os.path.isabs(p):
        return None
    p = os.path.normpath(p)
    if os.path.commonpath([b, p]) != b or p == b:
        return None
    return list(Path(os.path.relpath(p, b)).parts)


def _open_dirs(base: str | Path, parts: list[str]) -> int:
    """An fd of ``base/parts...``, every component a real directory (no link); OSError
    otherwise. ``base`` itself must not be a link either."""
    fd = os.open(base, _DIR)
    try:
        for name in parts:
            nxt = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_json_in(base: str | Path, parts: list[str], name: str, limit: int) -> Any | None:
    """JSON of the regular file ``base/parts.../name`` (at most ``limit`` bytes, one link
    count), or None: missing, a link at any component, a FIFO, too big, not JSON."""
    try:
        d = _open_dirs(base, parts)
    except (OSError, ValueError):
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=d)
    except (OSError, ValueError):
        return None
    finally:
        os.close(d)
    return read_json_fd(fd, limit)


def read_json_fd(fd: int, limit: int) -> Any | None:
    """JSON of the open file ``fd`` (closed here): None unless a regular file of one link
    count and at most ``limit`` bytes holding JSON (nested too deep counts as not JSON)."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # no hard link to another file
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > limit:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: [[[[...]]]] nested too deep
        return None


def exists_inside(base: str | Path, path: str | Path) -> bool:
    """True when ``path`` lies inside ``base`` and names an entry reached without following
    any link (the entry itself may be a file or dir, not a link)."""
    parts = inside(base, path)
    if not parts:
        return False
    try:
        d = _open_dirs(base, parts[:-1])
    except (OSError, ValueError):
        return False
    try:
        st = os.stat(parts[-1], dir_fd=d, follow_symlinks=False)
    except (OSError, ValueError):
        return False
    finally:
        os.close(d)
    return not stat.S_ISLNK(st.st_mode)
