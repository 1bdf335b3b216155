"""The Ray token of a miso cluster: Ray's own token authentication, always on.

Ray (>= 2.52) authenticates every GCS/raylet/dashboard call with a shared bearer token when
``RAY_AUTH_MODE=token``; it reads the token from ``RAY_AUTH_TOKEN``, else from the file named
by ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``. miso keeps one token per cluster in its
state directory (``ray_token``, mode 0600) and points ``RAY_AUTH_TOKEN_PATH`` at it before Ray
starts or connects, so the head, its workers and the operator's CLI agree and nothing else on
the machine can reach the cluster's Ray. Users never need Ray: they use the HTTP API.

For a multi-node cluster started with ``ray start``, export ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH`` (a copy of this file, 0600) on every node before ``ray start``.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

FILE = "ray_token"


def token_file(state_dir: str | Path) -> Path:
    return Path(state_dir) / FILE


def ensure(state_dir: str | Path) -> Path:
    """The cluster's token file, created (256 random bits, mode 0600) when missing."""
    f = token_file(state_dir)
    f.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return f
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    return f


def use(path: str | Path) -> None:
    """Make this process (and the processes it starts) use token auth with ``path``."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(Path(path).resolve())
    os.environ.pop("RAY_AUTH_TOKEN", None)
    _refresh()


def _refresh() -> None:
    if "ray" in sys.modules:  # Ray caches its config and the token it loaded
        from ray._raylet import AuthenticationTokenLoader, Config  # noqa: PLC0415

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def use_state_dir(state_dir: str | Path) -> Path:
    """:func:`ensure` and :func:`use` the token of ``state_dir``; returns the file."""
    f = ensure(state_dir)
    use(f)
    return f


def ensure_env() -> None:
    """Token auth on; when no token is configured (variables, ``~/.ray/auth_token``), a fresh
    one in a private temp dir (a throw-away local Ray, e.g. a test's)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH") \
            and not (Path.home() / ".ray" / "auth_token").exists():
        d = tempfile.mkdtemp(prefix="miso-ray-")
        atexit.register(shutil.rmtree, d, True)
        use(ensure(d))
    else:
        _refresh()
