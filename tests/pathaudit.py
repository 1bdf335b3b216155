"""Shared helper of the path-audit tests and the security benchmark: which directories a
non-root account could write (docs/security.md: no root process of miso uses a path inside a
directory another account can write)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path


def _bits(st: os.stat_result, uid: int, gids: set[int]) -> int:
    """The rwx bits (0-7) that apply to ``uid``/``gids`` on a file of ``st``."""
    if st.st_uid == uid:
        return (st.st_mode >> 6) & 7
    if st.st_gid in gids:
        return (st.st_mode >> 3) & 7
    return st.st_mode & 7


def can_write(path: str | Path, uid: int, gids: set[int]) -> bool:
    """True when ``uid`` (groups ``gids``, not root) can create, rename or replace entries in
    the directory ``path`` (a link: replace the link): search permission on every ancestor
    and write+search on it (mode bits; miso sets no ACLs)."""
    p = Path(os.path.abspath(path))
    for d in reversed(p.parents):
        if not _bits(os.stat(d), uid, gids) & 1:
            return False
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        return can_write(p.parent, uid, gids)
    return _bits(st, uid, gids) & 3 == 3


def writable_dirs(roots: Iterable[str | Path], uid: int, gids: set[int],
                  own_ok: bool = True) -> list[str]:
    """Every directory under ``roots`` (the roots and their parents included, links not
    followed) that ``uid`` could write. With ``own_ok``, directories owned by ``uid`` (the
    job's own dirs, which root reads only through directory fds) and what lies below them
    are left out."""
    bad: set[str] = set()
    for root in roots:
        r = Path(root)
        if not os.path.lexists(r):
            continue
        for d in [*reversed(r.parents), r]:
            st = os.lstat(d)
            sticky = d != r and st.st_mode & stat.S_ISVTX  # /tmp: our entry stays ours
            if can_write(d, uid, gids) and not sticky and not (own_ok and st.st_uid == uid):
                bad.add(str(d))
        for top, dirs, _files in os.walk(r, followlinks=False):
            keep = []
            for name in dirs:
                d = Path(top) / name
                try:
                    st = os.lstat(d)
                except OSError:
                    continue
                if own_ok and st.st_uid == uid:
                    continue
                if can_write(d, uid, gids):
                    bad.add(str(d))
                keep.append(name)
            dirs[:] = keep
    return sorted(bad)


def ray_dirs_from_proc() -> set[str]:
    """Ray's temp and session dirs named on the command lines of the running processes
    (``--temp-dir``/``--temp_dir``/``--session_dir``/``--session-dir``)."""
    out: set[str] = set()
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{e.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for i, a in enumerate(argv):
            s = a.decode(errors="replace")
            for flag in ("--temp-dir", "--temp_dir", "--session_dir", "--session-dir"):
                if s.startswith(flag + "="):
                    out.add(s.split("=", 1)[1])
                elif s == flag and i + 1 < len(argv):
                    out.add(argv[i + 1].decode(errors="replace"))
    return {d for d in out if d}
