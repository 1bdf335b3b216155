"""The ``services`` table of the job store: what ``miso serve`` asked for, kept across restarts,
and the capacity per replica measured live (which replaces the catalogue's for that service).

Its own connection to the job store's file (as :mod:`miso.controller.usagestore`)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS services (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    stopped_at REAL,
    capacity_rps REAL,
    capacity_profile TEXT
);
"""


@dataclass
class ServiceRecord:
    """A service as asked for (the live side's view; the core's spec is ``ServiceSpec``)."""

    name: str
    model: str
    slo_p99_ms: float
    command: list[str]
    owner: str | None = None
    owner_name: str | None = None
    unix_user: str | None = None
    min_replicas: int = 1
    max_replicas: int = 8
    headroom: float = 0.2
    memory_gb: float | None = None
    percentile: float = 99.0
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None  # where the replica command runs (miso serve's directory)
    state: str = "running"  # running | stopped
    created_at: float = 0.0
    capacity_rps: float | None = None  # measured live, per replica, on capacity_profile
    capacity_profile: str | None = None

    def spec_json(self) -> str:
        d = asdict(self)
        for k in ("state", "created_at", "capacity_rps", "capacity_profile"):
            d.pop(k)
        return json.dumps(d)


class ServiceStore:
    """The ``services`` table of the store at ``path``."""

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None,
                                   timeout=10.0)
        with self._lock:
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, rec: ServiceRecord) -> None:
        rec.created_at = rec.created_at or time.time()
        with self._lock:
            self._db.execute("DELETE FROM services WHERE name = ? AND state = 'stopped'",
                             (rec.name,))
            self._db.execute("INSERT INTO services(name, spec, state, created_at) "
                             "VALUES (?, ?, 'running', ?)",
                             (rec.name, rec.spec_json(), rec.created_at))

    def stop(self, name: str) -> None:
        with self._lock:
            self._db.execute("UPDATE services SET state = 'stopped', stopped_at = ? "
                             "WHERE name = ?", (time.time(), name))

    def set_capacity(self, name: str, rps: float, profile: str) -> None:
        with self._lock:
            self._db.execute("UPDATE services SET capacity_rps = ?, capacity_profile = ? "
                             "WHERE name = ?", (rps, profile, name))

    def all(self) -> list[ServiceRecord]:
        with self._lock:
            rows = self._db.execute("SELECT spec, state, created_at, capacity_rps, "
                                    "capacity_profile FROM services ORDER BY created_at"
                                    ).fetchall()
        out = []
        for spec, state, created, cap, prof in rows:
            d = json.loads(spec)
            out.append(ServiceRecord(**d, state=state, created_at=created, capacity_rps=cap,
                                     capacity_profile=prof))
        return out
