"""Runtime directories of miso's root processes (Ray's temp dir above all): created fresh,
private (0700, ours, checked with ``lstat``), never a name another account could have
prepared.

Ray makes its temp dir and every session dir below it mode 0777 without the sticky bit
(``try_make_directory_shared``), and follows links there as root. So Ray never gets a
directory another account can reach: it gets ``<private>/r``, where ``<private>`` is a 0700
directory of ours; the 0777 dirs below are then reachable by root alone. See docs/security.md.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

# Ray's longest socket path is <temp>/session_<date 26>_<pid <=7>/sockets/plasma_store and an
# AF_UNIX path holds at most 107 bytes: its temp dir must stay within this many
RAY_TEMP_MAX = 107 - len("/session_2026-01-01_00-00-00_000000_1234567/sockets/plasma_store")
RAY_SUBDIR = "r"


class UnsafeRuntimeDir(RuntimeError):
    """A runtime directory exists and is not ours, or is a link: refused, never used."""


def check_private(path: str | Path) -> None:
    """Raise :class:`UnsafeRuntimeDir` unless ``path`` (``lstat``: a link is refused) is a
    directory owned by this process's uid with no group or other permission bits."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeRuntimeDir(f"{path} is a symbolic link; refusing to use it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRuntimeDir(f"{path} exists and is not a directory; refusing to use it")
    if st.st_uid != os.geteuid():
        raise UnsafeRuntimeDir(f"{path} exists and belongs to uid {st.st_uid}, not to us "
                               f"(uid {os.geteuid()}); refusing to use it")
    if st.st_mode & 0o077:
        raise UnsafeRuntimeDir(f"{path} exists with mode {stat.S_IMODE(st.st_mode):o} (others "
                               "may write or enter it); refusing to use it")


def make_private(path: str | Path) -> Path:
    """Create ``path`` as a fresh 0700 directory of ours (its parent must exist). An existing
    ``path`` is accepted only when :func:`check_private` passes (ours, 0700, not a link: a
    restart of the same unit); anything else is refused."""
    p = Path(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(p, 0o700)
    check_private(p)
    return p


def fresh_private(prefix: str, root: str | None = None) -> Path:
    """A new 0700 directory of ours under ``root`` (default: the system temp dir) with an
    unpredictable name (``mkdtemp``), checked with ``lstat`` after creation."""
    p = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    check_private(p)
    return p


_per_process: dict[str, Path] = {}


def process_private(prefix: str) -> Path:
    """One :func:`fresh_private` dir per ``prefix`` for this process (made on first use): for
    an in-memory controller's checkpoints, never a fixed name such as /tmp/miso-ckpt."""
    if prefix not in _per_process:
        _per_process[prefix] = fresh_private(prefix)
    return _per_process[prefix]


def ray_temp_dir(private: str | Path) -> str:
    """Ray's temp dir inside the private dir ``private`` (which Ray must not get itself: it
    would make it 0777). Raises ValueError when its socket paths would exceed AF_UNIX's
    limit."""
    d = str(Path(private) / RAY_SUBDIR)
    if len(os.fsencode(d)) > RAY_TEMP_MAX:
        raise ValueError(f"Ray's temp dir {d} is longer than {RAY_TEMP_MAX} bytes: its socket "
                         "paths would not fit in an AF_UNIX address; use a shorter --temp-dir")
    return d
