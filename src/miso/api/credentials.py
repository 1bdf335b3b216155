"""Where the CLI finds the API's URL and its token.

In order: ``--url``/``--token`` flags, ``MISO_URL``/``MISO_TOKEN`` (and ``MISO_CA`` for a
private certificate authority), then a local cluster's state directory when one was named
(``--state-dir`` or ``MISO_STATE_DIR``), then the config file ``miso login`` writes
(``$MISO_CONFIG``, default ``~/.miso/config.json``, mode 0600), then the default state
directory ``~/.miso/cluster``. A state directory holds ``api.json`` (written by the server:
its URL) and ``operator.token``: the token of the admin that ``miso cluster up`` creates for
the local operator when the cluster has no user yet.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

API_FILE = "api.json"
OPERATOR_TOKEN = "operator.token"


@dataclass(frozen=True)
class Credentials:
    url: str | None
    token: str | None
    ca: str | None = None


def config_path() -> Path:
    return Path(os.environ.get("MISO_CONFIG") or Path.home() / ".miso" / "config.json")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 (atomically; parent made 0700 if new)."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_login(url: str, token: str, ca: str | None = None) -> Path:
    p = config_path()
    write_private(p, json.dumps({"url": url, "token": token, "ca": ca}, indent=2) + "\n")
    return p


def from_config() -> Credentials:
    d = _read_json(config_path())
    return Credentials(d.get("url"), d.get("token"), d.get("ca"))


def from_state_dir(state_dir: str | Path) -> Credentials:
    sd = Path(state_dir)
    api = _read_json(sd / API_FILE)
    try:
        token: str | None = (sd / OPERATOR_TOKEN).read_text().strip() or None
    except OSError:
        token = None
    return Credentials(api.get("url"), token, api.get("ca"))


def resolve(*, url: str | None, token: str | None, state_dir: str | None,
            default_state_dir: str | Path) -> Credentials:
    """The URL, token and CA to use (see the module docstring); fields may be None."""
    url = url or os.environ.get("MISO_URL") or None
    token = token or os.environ.get("MISO_TOKEN") or None
    ca = os.environ.get("MISO_CA") or None
    named = state_dir or os.environ.get("MISO_STATE_DIR")
    bases = ([from_state_dir(named)] if named else []) + [from_config()]
    if not named:
        bases.append(from_state_dir(default_state_dir))
    for b in bases:
        if b.url and (url is None or url == b.url):
            return Credentials(url or b.url, token or b.token, ca or b.ca)
    return Credentials(url, token, ca)
