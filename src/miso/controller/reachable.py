"""Whether another account can run a program: every directory on the way to the file the
path resolves to (symlinks followed: a venv's ``bin/python`` points at its base interpreter)
searchable, and the file executable, by that account's uid and groups. The controller asks at
submit time so that a job run as ``unix_user`` is refused with the reason then, not failed
later with "Permission denied"."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path


def _allows(st: os.stat_result, uid: int, gids: set[int], bit_owner: int, bit_group: int,
            bit_other: int) -> bool:
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & bit_owner)
    if st.st_gid in gids:
        return bool(st.st_mode & bit_group)
    return bool(st.st_mode & bit_other)


def unreachable(program: str, account: str) -> str | None:
    """Why ``account`` cannot execute ``program`` (an absolute path), or None when it can
    (or when the account or the file is unknown here: other checks say so)."""
    try:
        pw = pwd.getpwnam(account) if not account.isdigit() else pwd.getpwuid(int(account))
    except KeyError:
        return None
    uid = pw.pw_uid
    gids = set(os.getgrouplist(pw.pw_name, pw.pw_gid)) if hasattr(os, "getgrouplist") else \
        {pw.pw_gid, *(g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem)}
    real = Path(os.path.realpath(program))
    try:
        st = real.stat()
    except OSError:
        return None
    for d in reversed(real.parents):
        try:
            ds = d.stat()
        except OSError:
            return None
        if not _allows(ds, uid, gids, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            via = f" (it resolves to {real})" if str(real) != program else ""
            return (f"{program}{via} is not reachable by {account}: {d} is not searchable "
                    f"by that account")
    if not _allows(st, uid, gids, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
        return f"{real} is not executable by {account}"
    return None
