"""The ``miso cluster up`` config file: the flags an operator sets once (policy, tenancy, the
API's listen address and TLS), in TOML, so the systemd units and the Slurm batch script read
one file instead of repeating flags.

``miso cluster up --config FILE`` (or ``$MISO_CLUSTER_CONFIG``); a flag given on the command
line wins over the file. Keys are the flags' names without ``--`` (``fair-share`` or
``fair_share``)::

    policy = "miso+"
    listen = "0.0.0.0:8443"
    tls-cert = "/etc/miso/tls/cert.pem"
    tls-key = "/etc/miso/tls/key.pem"
    fair-share = true
    half-life = 604800
    preempt = false

The file is read with the standard library's :mod:`tomllib` (no new dependency).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Environment variable naming the file when ``--config`` is not given.
CONFIG_ENV = "MISO_CLUSTER_CONFIG"
#: Flags of ``cluster up`` the file may set (the rest are per-run: --emulated, --gpus...).
KEYS = ("policy", "listen", "tls_cert", "tls_key", "insecure", "metrics_public",
        "fair_share", "half_life", "preempt", "min_run_s", "reclaim", "demand_per_job",
        "fairness_price",
        "profile_seconds", "checkpoint_timeout", "estimator", "state_dir", "address",
        "gpus", "gpu_model", "emulated", "stop_uncheckpointable_after", "at_time_limit")
#: Largest config file read (it is a handful of lines).
MAX_BYTES = 64 << 10


def config_sets(args: list[str], key: str, env: dict[str, str] | None = None) -> bool:
    """Whether the config file that ``cluster up args`` would read (``--config FILE`` in
    ``args``, else ``$MISO_CLUSTER_CONFIG``) sets ``key`` (an unreadable file: no)."""
    import os

    path = None
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            path = args[i + 1]
        elif a.startswith("--config="):
            path = a.partition("=")[2]
    if path is None:
        path = (os.environ if env is None else env).get(CONFIG_ENV)
    if not path:
        return False
    try:
        return key.replace("-", "_") in read_up_config(path)
    except ConfigError:
        return False


class ConfigError(ValueError):
    """The file is missing, not TOML, or sets something ``cluster up`` does not take."""


def read_up_config(path: str | Path, allowed: Iterable[str] = KEYS) -> dict[str, Any]:
    """``{parameter name: value}`` from the file (keys with ``-`` or ``_``), or ConfigError
    naming the problem (unknown key: the allowed ones)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"--config {p}: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"--config {p}: larger than {MAX_BYTES} bytes")
    try:
        raw = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--config {p}: not TOML: {e}") from None
    ok = set(allowed)
    out: dict[str, Any] = {}
    for k, v in raw.items():
        name = k.replace("-", "_")
        if name not in ok:
            known = ", ".join(sorted(x.replace("_", "-") for x in ok))
            raise ConfigError(f"--config {p}: unknown key {k!r} (known: {known})")
        if isinstance(v, dict | list):
            raise ConfigError(f"--config {p}: {k} must be a plain value")
        out[name] = v
    return out
