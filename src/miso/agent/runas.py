"""Running a job under its owner's Unix account, in directories only that account can read.

When the agent runs as root (it must, to reconfigure MIG), a job of an API user with a Unix
account (``miso user add NAME --unix-user U``) runs as that account: ``subprocess`` switches
user, group and supplementary groups, no shell. The job's own directories (per-job log and
attempt directory, checkpoint directory) belong to the account with mode 0700, so one job
cannot read another's checkpoint. Directories above them inside the state directory get only
the traverse bit for others (``o+x``: reach by exact path, no listing); above the state
directory nothing is changed, and a path the account cannot traverse is a launch error.

Without root every job runs as the agent's own account (nothing to switch to), still in 0700
directories. A job submitted by the local operator (no owner) runs as the agent.

A job that switches account inherits nothing of the agent's environment: it gets ``PATH``
(a standard one), ``LANG``, ``USER``/``LOGNAME``/``HOME`` of its account, then the variables its
owner passed (``miso submit --env``/``--env-all``) and miso's own (:mod:`miso.job`).
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miso.jobpaths import read_json_fd


class RunAsError(ValueError):
    """The job cannot run as its owner (no such account, unreachable directory)."""


@dataclass(frozen=True)
class Account:
    """A Unix account a job runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    home: str | None = None


def resolve(unix_user: str) -> Account:
    """The account ``unix_user`` names: a login name, or a numeric uid (an id without a
    passwd entry runs with gid = uid and no supplementary groups)."""
    try:
        pw = pwd.getpwuid(int(unix_user)) if unix_user.isdigit() else pwd.getpwnam(unix_user)
    except KeyError:
        if unix_user.isdigit():
            return Account(unix_user, int(unix_user), int(unix_user))
        raise RunAsError(f"no Unix account {unix_user!r} on this node") from None
    groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid)
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)


def account_for(owner: str | None, unix_user: str | None) -> Account | None:
    """The account a job runs as; None: as the agent itself (not root, or no owner)."""
    if os.geteuid() != 0:
        return None
    if unix_user is None:
        if owner is None:
            return None
        raise RunAsError(f"user {owner!r} has no Unix account to run jobs as; an admin sets "
                         "one with `miso user add NAME --unix-user U`")
    return resolve(unix_user)


def switches(account: Account | None) -> bool:
    """Whether a job of ``account`` runs under another uid than this process."""
    return account is not None and account.uid != os.geteuid()


def popen_kwargs(account: Account | None) -> dict[str, Any]:
    """``subprocess.Popen`` keywords: private umask, and the account's ids when switching."""
    kw: dict[str, Any] = {"umask": 0o077}
    if account is not None and account.uid != os.geteuid():
        kw.update(user=account.uid, group=account.gid, extra_groups=list(account.groups))
    return kw


#: ``PATH`` of a job that switches account and passed none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def account_env(account: Account | None) -> dict[str, str]:
    """``USER``/``LOGNAME``/``HOME`` of the account a job switches to (empty otherwise)."""
    if account is None or account.uid == os.geteuid():
        return {}
    env = {"USER": account.name, "LOGNAME": account.name}
    if account.home:
        env["HOME"] = account.home
    return env


def base_env(account: Account | None, inherited: dict[str, str]) -> dict[str, str]:
    """The environment a job starts from, before its owner's variables and miso's: the
    agent's own (``inherited``) for a job of the agent's account; for a job that switches
    account nothing of the agent's, only ``PATH`` (:data:`DEFAULT_PATH`) and ``LANG``."""
    if account is None or account.uid == os.geteuid():
        return dict(inherited)
    env = {"PATH": DEFAULT_PATH}
    if "LANG" in inherited:
        env["LANG"] = inherited["LANG"]
    return env


def _traversable(st: os.stat_result, acc: Account) -> bool:
    if st.st_uid == acc.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == acc.gid or st.st_gid in acc.groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def private_dir(path: str | Path, account: Account | None, *, root: str | Path) -> Path:
    """Create ``path`` (and missing parents) owned by ``account`` (or this process) with mode
    0700, and let ``account`` reach it from ``root`` (see the module docstring)."""
    p = Path(path)
    missing = [d for d in (p, *p.parents) if not d.exists()]
    p.mkdir(parents=True, exist_ok=True)
    for d in missing[1:]:
        os.chmod(d, 0o700)  # new parents are private too (the umask may be lax)
    switch = account is not None and account.uid != os.geteuid()
    if switch:
        assert account is not None
        os.chown(p, account.uid, account.gid)
    os.chmod(p, 0o700)
    if not switch:
        return p
    assert account is not None
    top = Path(root).resolve()
    for d in p.resolve().parents:
        st = d.stat()
        inside = d == top or top in d.parents
        if _traversable(st, account):
            continue
        if not inside:
            raise RunAsError(f"the account {account.name} cannot reach {p}: {d} is closed to "
                             "it; put the state directory where jobs' accounts can traverse")
        os.chmod(d, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
    return p


def touch(path: str | Path) -> bool:
    """Create ``path`` if missing, never through a symlink or into a FIFO (its directory
    belongs to the job's account); False when that fails."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError:
        return False
    os.close(fd)
    return True


def read_json(path: str | Path, limit: int = 1 << 20) -> Any | None:
    """JSON from a file a job wrote, or None: only a regular file (no symlink, FIFO or
    device), at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    return read_json_fd(fd, limit)


def open_log(path: str | Path) -> int:
    """A log file for appending, mode 0600, never through a symlink; returns the fd."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Bounds of a job's own environment variables (the API bounds the count and each value;
#: the total stays well under the kernel's limit on a process's arguments and environment).
MAX_ENV_VARS = 512
MAX_ENV_BYTES = 1 << 20


def check_env(env: Any) -> dict[str, str]:
    """A job's own variables, checked: names ``[A-Za-z_][A-Za-z0-9_]*``, no NUL, at most
    :data:`MAX_ENV_VARS` of them and :data:`MAX_ENV_BYTES` in all. They reach only the job
    (after the drop to its owner's uid), never a process that runs as root."""
    if env is None:
        return {}
    if not isinstance(env, dict) or len(env) > MAX_ENV_VARS:
        raise RunAsError(f"a job's environment is a mapping of at most {MAX_ENV_VARS} variables")
    out: dict[str, str] = {}
    size = 0
    for k, v in env.items():
        k, v = str(k), str(v)
        if not ENV_NAME.fullmatch(k):
            raise RunAsError(f"bad environment variable name {k[:64]!r}")
        if "\0" in v:
            raise RunAsError(f"NUL byte in the value of {k}")
        size += len(k) + len(v) + 2
        if size > MAX_ENV_BYTES:
            raise RunAsError(f"a job's environment holds more than {MAX_ENV_BYTES} bytes")
        out[k] = v
    return out
