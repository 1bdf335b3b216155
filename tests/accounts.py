"""Shared test helper: a real, throw-away Unix account (tests that switch uids run as root)."""

from __future__ import annotations

import contextlib
import pwd
import secrets
import subprocess
from collections.abc import Iterator


@contextlib.contextmanager
def unix_account(prefix: str = "misot") -> Iterator[pwd.struct_passwd]:
    """Create an account with no home and no login; remove it (and its processes) after."""
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", name], capture_output=True)
