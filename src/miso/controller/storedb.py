"""The job store's one SQLite connection: opening (schema, version, migration), its lock, the
``meta`` table (epoch, next job id, lease horizon) and backups.

Thread-safe (one connection, one lock); WAL mode so a crash loses at most the last transaction.
The parts of :class:`~miso.controller.store.JobStore` (jobs, attempts, the event log) all use
this one connection, through :attr:`StoreDb.conn` and :attr:`StoreDb.lock`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from miso.controller.schema import (
    GANG_COLUMNS,
    REQUEST_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    V2_COLUMNS,
    StoreError,
)
from miso.sqlitebackup import backup_private


class StoreDb:
    """One open store file (``":memory:"`` for a throw-away store)."""

    def __init__(self, path: str | Path, *, first_id: int = 1) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # Private: SQLite gives the -wal and -shm files the database file's mode.
            Path(self.path).touch(mode=0o600, exist_ok=True)
            os.chmod(self.path, 0o600)
        self._epoch: float | None = None
        self._backup_lock = threading.Lock()
        try:
            self.conn = sqlite3.connect(self.path, check_same_thread=False,
                                        isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            self.lock = threading.RLock()
            with self.lock:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                v = self._meta_or_none("schema_version")
                self.conn.executescript(SCHEMA)
                # Columns added after schema version 1 (nullable, so older readers still work).
                cols = {r[1] for r in self.conn.execute("PRAGMA table_info(jobs)")}
                for col in ("owner", "unix_user", "owner_name"):
                    if col not in cols:
                        self.conn.execute(f"ALTER TABLE jobs ADD COLUMN {col} TEXT")
                if "host_memory_gb" not in cols:  # issue 26: a job's host-memory bound
                    self.conn.execute("ALTER TABLE jobs ADD COLUMN host_memory_gb REAL")
                for col, decl in (*GANG_COLUMNS, *REQUEST_COLUMNS):
                    if col not in cols:
                        self.conn.execute(f"ALTER TABLE jobs ADD COLUMN {col} {decl}")
                self.conn.execute("CREATE INDEX IF NOT EXISTS jobs_owner ON jobs(owner, seq)")
                # the unique-name check of every submit (a table scan without it)
                self.conn.execute("CREATE INDEX IF NOT EXISTS jobs_name ON jobs(name, owner)")
                self.conn.execute("CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state)")
                if v is None:
                    self.set_meta("schema_version", str(SCHEMA_VERSION))
                    self.set_meta("epoch", repr(time.time()))
                    self.set_meta("next_job", str(max(1, first_id)))
                elif int(v) == 1:
                    self._migrate_v1()
                elif int(v) != SCHEMA_VERSION:
                    raise StoreError(f"{self.path}: schema version {v}, this miso reads "
                                     f"{SCHEMA_VERSION}; migrate or use a new state directory")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a readable job store ({e})") from None

    def _meta_or_none(self, key: str) -> str | None:
        try:
            return self.meta(key)
        except sqlite3.OperationalError:  # no meta table yet: a new store
            return None

    def _migrate_v1(self) -> None:
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(jobs)")}
        for col, decl in V2_COLUMNS:
            if col not in have:
                self.conn.execute(f"ALTER TABLE jobs ADD COLUMN {col} {decl}")
        self.conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS jobs_request ON jobs(request_id)")
        self.set_meta("schema_version", str(SCHEMA_VERSION))

    def backup(self, dest: str | Path) -> None:
        """Copy the whole store to ``dest`` (consistent while in use; mode 0600): the last
        committed state, read on a connection of its own (one read transaction: in WAL mode
        the writers go on meanwhile; copying a big store under :attr:`lock` stopped every
        submission and every update of the controller for as long as it took)."""
        with self._backup_lock:  # one copy at a time (they share the temp file)
            if self.path == ":memory:":
                with self.lock:
                    backup_private(self.conn, dest)
                return
            src = sqlite3.connect(self.path)
            try:
                backup_private(src, dest)
            finally:
                src.close()

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    # ---- meta ---------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A value of the ``meta`` table (callers hold :attr:`lock` when it matters)."""
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO "
                          "UPDATE SET value=excluded.value", (key, value))

    @property
    def epoch(self) -> float:
        """Wall-clock time (s) of the store's creation: the controller clock's zero (read once:
        it never changes, and the controller asks for it on every clock reading)."""
        got = self._epoch
        if got is None:
            got = float(self.meta("epoch") or 0.0)
            if got:
                self._epoch = got
        return got

    @property
    def lease_horizon(self) -> float:
        """No agent lease granted by any controller of this store ends after this wall-clock
        time (seconds since the epoch); 0 when none was granted."""
        with self.lock:
            return float(self.meta("lease_horizon") or 0.0)

    @lease_horizon.setter
    def lease_horizon(self, t: float) -> None:
        with self.lock:
            self.set_meta("lease_horizon", repr(float(t)))

    @property
    def schema_version(self) -> int:
        return int(self.meta("schema_version") or 0)


class ReadDb:
    """A second, read-only connection to a store file, with its own lock: readers that must
    not wait behind the writers (the API's status and job lists, while the poller, the GPU
    workers and the loop write). In WAL mode it reads the last committed state without
    blocking or being blocked by a writer. Has what a part's reads use of
    :class:`StoreDb`: ``path``, ``conn``, ``lock``, ``epoch``."""

    def __init__(self, db: StoreDb) -> None:
        self.db = db
        self.path = db.path
        self.conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA query_only=1")
        self.lock = threading.RLock()

    @property
    def epoch(self) -> float:
        return self.db.epoch

    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        with self.lock:
            self.conn.close()

