"""Durable job store (SQLite, schema-versioned): jobs, their attempts, applied layouts, events.

Job states: ``queued`` (waiting, or resident on a GPU but not running), ``profiling`` (running
under MPS to be profiled), ``running``, ``checkpointing`` (asked to save and stop),
``finished``, ``failed``, ``cancelled``. Terminal states never change again, which is what makes
"every job finishes exactly once" checkable: :meth:`JobStore.finish` is a conditional update.

Thread-safe (one connection, one lock); WAL mode so a crash loses at most the last transaction.

Memory: ``memory_gb`` is what the user asked for, in GB (10^9 bytes); ``memory_gib`` is the
same amount in GiB (2^30 bytes), the unit of MIG profiles, and the one scheduling uses.

Damage: :func:`miso.controller.storefile.open_store` refuses (one-line :class:`StoreError`) a
store that is missing, empty or unreadable in a state directory that held one before, and says
how to recover. A row that cannot be read is skipped (listed in :attr:`JobStore.bad_rows`), not
fatal. The schema, the job states and :class:`JobRecord` are :mod:`miso.controller.schema`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from miso.controller.schema import (
    GIB_PER_GB,
    NAME_FREED,
    SCHEMA,
    SCHEMA_VERSION,
    STATES,
    TERMINAL,
    V2_COLUMNS,
    JobRecord,
    StoreConflict,
    StoreError,
)

log = logging.getLogger(__name__)


def _differs(rec: JobRecord, **asked: Any) -> list[str]:
    """The fields of a repeated submission that differ from the job ``rec`` it names."""
    out = []
    for k, v in asked.items():
        have = getattr(rec, k)
        if k == "name" and v is None:
            v = rec.id if rec.name == rec.id else v
        if k == "memory_gb":
            if not math.isclose(float(have), float(v), rel_tol=1e-9):
                out.append(k)
        elif have != v:
            out.append(k)
    return out


class JobStore:
    """SQLite-backed store; ``path=":memory:"`` for a throw-away store."""

    def __init__(self, path: str | Path, *, first_id: int = 1) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # Private: SQLite gives the -wal and -shm files the database file's mode.
            Path(self.path).touch(mode=0o600, exist_ok=True)
            os.chmod(self.path, 0o600)
        #: Job ids whose rows could not be read (skipped by :meth:`jobs`).
        self.bad_rows: list[str] = []
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False,
                                       isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._lock = threading.RLock()
            with self._lock:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                v = self._meta_or_none("schema_version")
                self._db.executescript(SCHEMA)
                # Columns added after schema version 1 (nullable, so older readers still work).
                cols = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)")}
                for col in ("owner", "unix_user", "owner_name"):
                    if col not in cols:
                        self._db.execute(f"ALTER TABLE jobs ADD COLUMN {col} TEXT")
                self._db.execute("CREATE INDEX IF NOT EXISTS jobs_owner ON jobs(owner, seq)")
                # the unique-name check of every submit (a table scan without it)
                self._db.execute("CREATE INDEX IF NOT EXISTS jobs_name ON jobs(name, owner)")
                self._db.execute("CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state)")  # counts
                if v is None:
                    self._set_meta("schema_version", str(SCHEMA_VERSION))
                    self._set_meta("epoch", repr(time.time()))
                    self._set_meta("next_job", str(max(1, first_id)))
                elif int(v) == 1:
                    self._migrate_v1()
                elif int(v) != SCHEMA_VERSION:
                    raise StoreError(f"{self.path}: schema version {v}, this miso reads "
                                     f"{SCHEMA_VERSION}; migrate or use a new state directory")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a readable job store ({e})") from None

    def _meta_or_none(self, key: str) -> str | None:
        try:
            return self._meta(key)
        except sqlite3.OperationalError:  # no meta table yet: a new store
            return None

    def _migrate_v1(self) -> None:
        have = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)")}
        for col, decl in V2_COLUMNS:
            if col not in have:
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {col} {decl}")
        self._db.execute("CREATE UNIQUE INDEX IF NOT EXISTS jobs_request ON jobs(request_id)")
        self._set_meta("schema_version", str(SCHEMA_VERSION))

    def backup(self, dest: str | Path) -> None:
        """Copy the whole store to ``dest`` (consistent, while in use)."""
        tmp = Path(f"{dest}.tmp")
        with self._lock:  # one copy at a time (they share the temp file)
            out = sqlite3.connect(tmp)
            try:
                self._db.backup(out)
            finally:
                out.close()
            tmp.replace(dest)

    # ---- meta ---------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO "
                         "UPDATE SET value=excluded.value", (key, value))

    @property
    def epoch(self) -> float:
        """Wall-clock time (s) of the store's creation: the controller clock's zero (read once:
        it never changes, and the controller asks for it on every clock reading)."""
        got = getattr(self, "_epoch", None)
        if got is None:
            got = float(self._meta("epoch") or 0.0)
            if got:
                self._epoch = got
        return got

    @property
    def lease_horizon(self) -> float:
        """No agent lease granted by any controller of this store ends after this wall-clock
        time (seconds since the epoch); 0 when none was granted."""
        with self._lock:
            return float(self._meta("lease_horizon") or 0.0)

    @lease_horizon.setter
    def lease_horizon(self, t: float) -> None:
        with self._lock:
            self._set_meta("lease_horizon", repr(float(t)))

    @property
    def schema_version(self) -> int:
        return int(self._meta("schema_version") or 0)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- jobs ---------------------------------------------------------------------------

    def submit(self, *, command: list[str], name: str | None, memory_gb: float,
               memory_gib: float | None = None, workload: str | None = None,
               env: dict[str, str] | None = None, cwd: str | None = None,
               at: float | None = None, owner: str | None = None,
               unix_user: str | None = None, request_id: str | None = None,
               owner_name: str | None = None) -> JobRecord:
        """Add a queued job. Names are unique among an owner's active and finished jobs; a
        failed or cancelled job's name is free again (its records stay, by id; the name then
        means the newest job).
        ``owner`` is the id of the API user who submitted it (None: the local operator),
        ``owner_name`` its name then, ``unix_user`` the account its processes run as when the
        agent is root. A known ``request_id`` returns the job it created (a retried
        submission) when the request is the same, and is a :class:`StoreConflict` when not."""
        if not command:
            raise StoreError("empty command")
        if not (isinstance(memory_gb, int | float) and math.isfinite(memory_gb)
                and memory_gb > 0):
            raise StoreError(f"memory must be a positive number of GB, got {memory_gb}")
        gib = float(memory_gb) * GIB_PER_GB if memory_gib is None else float(memory_gib)
        try:
            with self._lock:
                if request_id is not None:
                    old = self._db.execute("SELECT id FROM jobs WHERE request_id=?",
                                           (request_id,)).fetchone()
                    if old is not None:
                        rec = self.get(str(old[0]))
                        differs = _differs(rec, command=[str(c) for c in command], name=name,
                                           memory_gb=float(memory_gb), workload=workload,
                                           env=env or {}, cwd=cwd, owner=owner)
                        if differs:
                            raise StoreConflict(
                                f"request_id {request_id.split(':', 1)[-1]!r} was used for job "
                                f"{rec.id} with another {', '.join(differs)}: a retry must "
                                f"repeat the request; use a new request_id for a new job")
                        return rec
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    n = int(self._meta("next_job") or 1)
                    jid = f"j{n:04d}"
                    name = name or jid
                    dup = self._db.execute(
                        "SELECT id, state FROM jobs WHERE (name=? AND owner IS ?) OR id=? "
                        "ORDER BY seq DESC", (name, owner, name)).fetchone()
                    if dup is not None and (dup[0] == name or dup[1] not in NAME_FREED):
                        what = f"is already active ({dup[0]})" if dup[1] not in TERMINAL \
                            else f"already exists ({dup[0]}, {dup[1]})"
                        raise StoreError(f"a job named {name!r} {what}; names are unique "
                                         "among active and finished jobs: choose another")
                    self._db.execute(
                        "INSERT INTO jobs(id, name, command, memory_gb, memory_gib, workload, "
                        "env, cwd, state, submitted_at, owner, unix_user, request_id, "
                        "owner_name) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (jid, name, json.dumps(list(command)), float(memory_gb), gib,
                         workload, json.dumps(env or {}), cwd, "queued",
                         time.time() - self.epoch if at is None else at, owner, unix_user,
                         request_id, owner_name))
                    self._set_meta("next_job", str(n + 1))
                    self._db.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                    raise
        except sqlite3.OperationalError as e:
            raise StoreError(f"cannot record the job in {self.path}: {e}") from None
        return self.get(jid)

    def _row(self, r: sqlite3.Row) -> JobRecord:
        d = dict(r)
        d.pop("seq", None)
        d["command"] = json.loads(d["command"])
        d["env"] = json.loads(d["env"])
        if not isinstance(d["command"], list) or not isinstance(d["env"], dict):
            raise ValueError("command must be a list and env a mapping")
        d["command"] = [str(c) for c in d["command"]]
        if d.get("memory_gib") is None:
            d["memory_gib"] = float(d["memory_gb"]) * GIB_PER_GB
        if d.get("checkpointable") is not None:
            d["checkpointable"] = bool(d["checkpointable"])
        d["note"] = d.get("note") or ""
        return JobRecord(**d)

    def _rows(self, rows: list[sqlite3.Row]) -> list[JobRecord]:
        out = []
        for r in rows:
            try:
                out.append(self._row(r))
            except (ValueError, TypeError) as e:
                jid = str(dict(r).get("id"))
                if jid not in self.bad_rows:
                    self.bad_rows.append(jid)
                    log.error("job store: row of job %s is malformed (%s): ignored", jid, e)
        return out

    def get(self, job: str, *, owner: str | None = None) -> JobRecord:
        """A job by id, else by name (the latest of that name); with ``owner``, names are
        looked up among that owner's jobs only."""
        q = "SELECT * FROM jobs WHERE id=? OR (name=?"
        args: tuple[Any, ...] = (job, job)
        if owner is not None:
            q, args = q + " AND owner=?", (*args, owner)
        with self._lock:
            r = self._db.execute(q + ") ORDER BY (id=?) DESC, seq DESC LIMIT 1",
                                 (*args, job)).fetchone()
        if r is None:
            raise StoreError(f"no job {job!r}")
        got = self._rows([r])
        if not got:
            raise StoreError(f"the store's record of job {job!r} is malformed")
        return got[0]

    def jobs(self, *, active_only: bool = False, owner: str | None = None,
             limit: int | None = None) -> list[JobRecord]:
        """Jobs in submission order; ``owner`` keeps one owner's, ``limit`` the latest."""
        where, args = [], []
        if active_only:
            where.append(f"state NOT IN {TERMINAL}")
        if owner is not None:
            where.append("owner=?")
            args.append(owner)
        q = "SELECT * FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        if limit is not None:
            q = f"SELECT * FROM ({q} ORDER BY seq DESC LIMIT ?)"
            args.append(int(limit))
        with self._lock:
            return self._rows(list(self._db.execute(q + " ORDER BY seq", args)))

    def counts(self, *, owner: str | None = None) -> dict[str, int]:
        """Number of jobs in each state (of one owner, or of everyone)."""
        q, args = "SELECT state, count(*) FROM jobs", ()
        if owner is not None:
            q, args = q + " WHERE owner=?", (owner,)
        with self._lock:
            return {str(s): int(n) for s, n in self._db.execute(q + " GROUP BY state", args)}

    def owners(self, ids: list[str] | set[str]) -> dict[str, str | None]:
        """The owner of each of ``ids`` (unknown ids are left out)."""
        ids = list(ids)
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = self._db.execute(f"SELECT id, owner FROM jobs WHERE id IN ({marks})", ids)
            return {str(i): o for i, o in rows}

    def owner_rows(self) -> list[tuple[str, str, float]]:
        """``(job id, owner, submitted_at as wall-clock time)`` of every job with an owner."""
        with self._lock:
            rows = self._db.execute("SELECT id, owner, submitted_at FROM jobs WHERE owner IS "
                                    "NOT NULL").fetchall()
        return [(str(i), str(o), self.epoch + float(t)) for i, o, t in rows]

    def set_owner(self, jobs: list[str], owner: str, owner_name: str) -> None:
        """Give ``jobs`` (any state) to the user id ``owner`` (a store migration)."""
        with self._lock:
            self._db.executemany("UPDATE jobs SET owner=?, owner_name=? WHERE id=?",
                                 [(owner, owner_name, j) for j in jobs])

    def job_ids(self) -> set[str]:
        """Every job id in the store (malformed rows too)."""
        with self._lock:
            return {str(r[0]) for r in self._db.execute("SELECT id FROM jobs")}

    def open_attempts(self) -> list[dict[str, Any]]:
        """Attempts with no recorded end."""
        with self._lock:
            return [dict(r) for r in self._db.execute(
                "SELECT * FROM attempts WHERE ended_at IS NULL ORDER BY job, attempt")]

    def update(self, job: str, **fields: Any) -> None:
        """Set fields of a job that is not terminal (terminal jobs are frozen)."""
        if not fields:
            return
        if "state" in fields and fields["state"] not in STATES:
            raise StoreError(f"unknown state {fields['state']!r}")
        if "placement" in fields and fields["placement"] is not None and \
                not isinstance(fields["placement"], str):
            fields["placement"] = str(fields["placement"])
        cols = ", ".join(f"{k}=?" for k in fields)
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {cols} WHERE id=? AND state NOT IN {TERMINAL}",
                             (*fields.values(), job))

    def progress(self, job: str, **fields: Any) -> None:
        """Progress fields (iteration, total, rate, checkpoint_*), allowed in any state."""
        cols = ", ".join(f"{k}=?" for k in fields)
        with self._lock:
            self._db.execute(f"UPDATE jobs SET {cols} WHERE id=?", (*fields.values(), job))

    def finish(self, job: str, state: str, *, reason: str = "", at: float) -> bool:
        """Move a job to a terminal state; False (no change) if it already is terminal."""
        if state not in TERMINAL:
            raise StoreError(f"{state!r} is not a terminal state")
        with self._lock:
            cur = self._db.execute(
                f"UPDATE jobs SET state=?, reason=?, ended_at=? WHERE id=? AND state NOT IN "
                f"{TERMINAL}", (state, reason, at, job))
            return cur.rowcount == 1

    # ---- attempts -----------------------------------------------------------------------

    def new_attempt(self, job: str, *, node: str, gpu: str, placement: str,
                    mps_pct: int | None, resume_iteration: int | None, at: float,
                    restart: bool, at_least: int = 1) -> int:
        """Record a new attempt of ``job`` and return its number (1, 2, ...; at least
        ``at_least``: numbers already used on disk are never handed out again)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                n = max(at_least, int(self._db.execute("SELECT attempts FROM jobs WHERE id=?",
                                                       (job,)).fetchone()[0]) + 1)
                self._db.execute(
                    "UPDATE jobs SET attempts=?, restarts=restarts+? WHERE id=?",
                    (n, 1 if restart else 0, job))
                self._db.execute(
                    "INSERT INTO attempts(job, attempt, node, gpu, placement, mps_pct, "
                    "resume_iteration, started_at) VALUES(?,?,?,?,?,?,?,?)",
                    (job, n, node, gpu, placement, mps_pct, resume_iteration, at))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return n

    def end_attempt(self, job: str, attempt: int, *, status: str, at: float,
                    end_iteration: int | None, checkpoint_iteration: int | None,
                    start_iteration: int | None, log: str | None = None) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE attempts SET status=?, ended_at=?, end_iteration=?, "
                "checkpoint_iteration=?, start_iteration=COALESCE(?, start_iteration), "
                "log=COALESCE(?, log) WHERE job=? AND attempt=? AND ended_at IS NULL",
                (status, at, end_iteration, checkpoint_iteration, start_iteration, log, job,
                 attempt))

    def attempts(self, job: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM attempts", ()
        if job is not None:
            q, args = q + " WHERE job=?", (job,)
        with self._lock:
            return [dict(r) for r in self._db.execute(q + " ORDER BY job, attempt", args)]

    # ---- layouts and events -------------------------------------------------------------

    def record_layout(self, gpu: str, model: str, layout: list[list[Any]], *,
                      plan_id: int | None, ok: bool, at: float) -> None:
        with self._lock:
            self._db.execute("INSERT INTO layouts(at, gpu, model, plan_id, layout, ok) "
                             "VALUES(?,?,?,?,?,?)",
                             (at, gpu, model, plan_id, json.dumps(layout), int(ok)))

    def layouts(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = [dict(r) for r in self._db.execute("SELECT * FROM layouts ORDER BY seq")]
        for r in rows:
            r["layout"] = json.loads(r["layout"])
        return rows

    def log_event(self, at: float, kind: str, body: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT INTO events(at, kind, body) VALUES(?,?,?)",
                             (at, kind, json.dumps(body, default=str)))

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM events", ()
        if kind:
            q, args = q + " WHERE kind=?", (kind,)
        with self._lock:
            rows = [dict(r) for r in self._db.execute(q + " ORDER BY seq", args)]
        for r in rows:
            r["body"] = json.loads(r["body"])
        return rows
