"""Shared helper of the tests and the security benchmark: a real, throw-away Unix account
(what switches uids runs as root)."""

from __future__ import annotations

import contextlib
import pwd
import secrets
import subprocess
import time
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
        # userdel refuses while the account still has processes: wait for the kills to land
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and subprocess.run(
                ["pgrep", "-u", name], capture_output=True).returncode == 0:
            time.sleep(0.02)
        subprocess.run(["userdel", name], capture_output=True)
