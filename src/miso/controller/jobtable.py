"""The job store's jobs: submitting, reading, and moving a job between states.

A part of :class:`~miso.controller.store.JobStore` (over its one connection,
:class:`~miso.controller.storedb.StoreDb`). Terminal states never change again, which is what
makes "every job finishes exactly once" checkable: :meth:`JobTable.finish` is a conditional
update. A row that cannot be read is skipped (listed in :attr:`JobTable.bad_rows`), not fatal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sqlite3
from typing import Any

from miso.controller.jobinsert import GroupWriter, Pending, conflict_check
from miso.controller.schema import (
    GIB_PER_GB,
    STATES,
    TERMINAL,
    JobRecord,
    StoreError,
)
from miso.controller.storedb import StoreDb

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


class JobTable:
    """The ``jobs`` table (see the module docstring)."""

    def __init__(self, s: StoreDb) -> None:
        self.s = s
        #: Job ids whose rows could not be read (skipped by :meth:`jobs`).
        self.bad_rows: list[str] = []
        #: submissions written in groups (:mod:`miso.controller.jobinsert`)
        self.writer = GroupWriter(s, self.by_ids)

    def submit(self, *, command: list[str], name: str | None, memory_gb: float,
               memory_gib: float | None = None, workload: str | None = None,
               env: dict[str, str] | None = None, cwd: str | None = None,
               at: float | None = None, owner: str | None = None,
               unix_user: str | None = None, request_id: str | None = None,
               owner_name: str | None = None,
               host_memory_gb: float | None = None, num_gpus: int = 1,
               nodes: int | None = None, profile: str | None = None,
               after: list[str] | None = None) -> JobRecord:
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
        gang = num_gpus != 1 or nodes is not None  # GANG_COLUMNS: NULL for one GPU
        row = {"command": list(command), "name": name, "memory_gb": float(memory_gb),
               "memory_gib": gib, "workload": workload, "env": env or {}, "cwd": cwd,
               "at": at, "owner": owner, "unix_user": unix_user, "request_id": request_id,
               "owner_name": owner_name, "host_memory_gb": host_memory_gb,
               "num_gpus": int(num_gpus) if gang else None, "nodes": nodes if gang else None,
               "profile": profile, "after": list(after) if after else None}

        def differs(rec: JobRecord) -> list[str]:
            return _differs(rec, command=[str(c) for c in command], name=name,
                            memory_gb=float(memory_gb), workload=workload, env=env or {},
                            cwd=cwd, owner=owner)
        check = conflict_check(request_id or "", differs)
        return self.writer.write(Pending(row, check))

    def by_ids(self, ids: list[str]) -> dict[str, JobRecord]:
        """The records of ``ids`` (unknown or malformed ones left out), in reads of 500."""
        out: dict[str, JobRecord] = {}
        with self.s.lock:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                rows = list(self.s.conn.execute(
                    f"SELECT * FROM jobs WHERE id IN ({','.join('?' * len(part))})", part))
                out.update((r.id, r) for r in self._rows(rows))
        return out

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
        d["profile"] = d.pop("mig_profile", None)
        after = json.loads(d.pop("after_jobs", None) or "null")
        if after is not None and not (isinstance(after, list)
                                      and all(isinstance(a, str) for a in after)):
            raise ValueError("after must be a list of job ids")
        d["after"] = after
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
        with self.s.lock:
            r = self.s.conn.execute(q + ") ORDER BY (id=?) DESC, seq DESC LIMIT 1",
                                 (*args, job)).fetchone()
        if r is None:
            raise StoreError(f"no job {job!r}")
        got = self._rows([r])
        if not got:
            raise StoreError(f"the store's record of job {job!r} is malformed")
        return got[0]

    def jobs(self, *, active_only: bool = False, owner: str | None = None,
             limit: int | None = None, state: str | None = None,
             offset: int = 0) -> list[JobRecord]:
        """Jobs in submission order; ``owner`` keeps one owner's, ``state`` one state's,
        ``limit`` the latest (after skipping the ``offset`` latest: one page, read in SQL)."""
        where, args = [], []
        if active_only:
            where.append(f"state NOT IN {TERMINAL}")
        if owner is not None:
            where.append("owner=?")
            args.append(owner)
        if state is not None:
            where.append("state=?")
            args.append(state)
        q = "SELECT * FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        if limit is not None or offset:
            q = f"SELECT * FROM ({q} ORDER BY seq DESC LIMIT ? OFFSET ?)"
            args.extend([-1 if limit is None else int(limit), max(0, int(offset))])
        with self.s.lock:
            return self._rows(list(self.s.conn.execute(q + " ORDER BY seq", args)))

    def counts(self, *, owner: str | None = None) -> dict[str, int]:
        """Number of jobs in each state (of one owner, or of everyone)."""
        q, args = "SELECT state, count(*) FROM jobs", ()
        if owner is not None:
            q, args = q + " WHERE owner=?", (owner,)
        with self.s.lock:
            return {str(s): int(n) for s, n in self.s.conn.execute(q + " GROUP BY state", args)}

    def counts_by_owner(self) -> dict[str | None, dict[str, int]]:
        """Number of jobs in each state per owner id (None: jobs without an owner), states in
        the order :meth:`counts` gives them. One row comes back (the groups as one JSON
        array): each row fetched is a hand-back of the interpreter lock, which in a busy
        controller process costs milliseconds apiece."""
        with self.s.lock:
            row = self.s.conn.execute(
                "SELECT json_group_array(json_array(owner, state, n)) FROM (SELECT owner, "
                "state, count(*) AS n FROM jobs GROUP BY owner, state)"
            ).fetchone()
        out: dict[str | None, dict[str, int]] = {}
        for owner, state, n in json.loads(row[0] if row and row[0] else "[]"):
            out.setdefault(None if owner is None else str(owner), {})[str(state)] = int(n)
        return {o: dict(sorted(c.items())) for o, c in out.items()}

    def brief(self) -> list[dict[str, Any]]:
        """Every job's id, state, owner, owner name and submission time: what the metrics
        count (one read of five columns, no record decoded)."""
        with self.s.lock:  # one row back (a JSON array), not one per job: see counts_by_owner
            row = self.s.conn.execute(
                "SELECT json_group_array(json_array(id, state, owner, owner_name, "
                "submitted_at)) FROM (SELECT id, state, owner, owner_name, submitted_at FROM jobs "
                "ORDER BY seq)").fetchone()
        return [{"id": i, "state": st, "owner": o, "owner_name": n, "submitted_at": t}
                for i, st, o, n, t in json.loads(row[0] if row and row[0] else "[]")]

    def owners(self, ids: list[str] | set[str]) -> dict[str, str | None]:
        """The owner of each of ``ids`` (unknown ids are left out)."""
        ids = list(ids)
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        with self.s.lock:  # one row back (a JSON object), not one per job
            row = self.s.conn.execute("SELECT json_group_object(id, owner) FROM jobs WHERE id "
                                      f"IN ({marks})", ids).fetchone()
        got = json.loads(row[0] if row and row[0] else "{}")
        return {str(i): None if o is None else str(o) for i, o in got.items()}

    def pinned(self, ids: list[str] | set[str]) -> dict[str, tuple[str | None, str | None, str]]:
        """Those of ``ids`` that cannot checkpoint (``checkpointable`` false), each with its
        owner, owner name and name: what ``status`` says about the jobs that keep their slices,
        in one read per 500 ids instead of one per job (unknown ids are left out)."""
        ids = list(ids)
        out: dict[str, tuple[str | None, str | None, str]] = {}
        with self.s.lock:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                rows = self.s.conn.execute(
                    "SELECT id, owner, owner_name, name FROM jobs WHERE checkpointable=0 AND "
                    f"id IN ({','.join('?' * len(part))})", part)
                out.update({str(j): (o, n, str(nm)) for j, o, n, nm in rows})
        return out

    def owner_rows(self) -> list[tuple[str, str, float]]:
        """``(job id, owner, submitted_at as wall-clock time)`` of every job with an owner."""
        with self.s.lock:
            rows = self.s.conn.execute("SELECT id, owner, submitted_at FROM jobs WHERE owner IS "
                                    "NOT NULL").fetchall()
        return [(str(i), str(o), self.s.epoch + float(t)) for i, o, t in rows]

    def set_owner(self, jobs: list[str], owner: str, owner_name: str) -> None:
        """Give ``jobs`` (any state) to the user id ``owner`` (a store migration)."""
        with self.s.lock:
            self.s.conn.executemany("UPDATE jobs SET owner=?, owner_name=? WHERE id=?",
                                 [(owner, owner_name, j) for j in jobs])

    def job_ids(self) -> set[str]:
        """Every job id in the store (malformed rows too)."""
        with self.s.lock:
            return {str(r[0]) for r in self.s.conn.execute("SELECT id FROM jobs")}

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
        with self.s.lock:
            self.s.conn.execute(f"UPDATE jobs SET {cols} WHERE id=? AND state NOT IN {TERMINAL}",
                             (*fields.values(), job))

    def progress(self, job: str, **fields: Any) -> None:
        """Progress fields (iteration, total, rate, checkpoint_*), allowed in any state."""
        cols = ", ".join(f"{k}=?" for k in fields)
        with self.s.lock:
            self.s.conn.execute(f"UPDATE jobs SET {cols} WHERE id=?", (*fields.values(), job))

    def progress_many(self, updates: list[tuple[str, dict[str, Any]]]) -> None:
        """:meth:`progress` of several jobs in one transaction (an agent's report)."""
        by_cols: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
        for job, fields in updates:  # one statement per set of columns, run in C
            by_cols.setdefault(tuple(fields), []).append((*fields.values(), job))
        with self.s.lock:
            self.s.conn.execute("BEGIN")
            try:
                for cols, rows in by_cols.items():
                    sets = ", ".join(f"{k}=?" for k in cols)
                    self.s.conn.executemany(f"UPDATE jobs SET {sets} WHERE id=?", rows)
                self.s.conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.s.conn.execute("ROLLBACK")
                raise

    def place_many(self, placed: dict[str, str]) -> None:
        """Set the GPU of each job in ``placed`` (job -> GPU) that is not terminal, in one
        transaction: the scheduling loop's placements of one turn (one statement each cost
        a transaction and a hand-back of the interpreter lock per placement)."""
        if not placed:
            return
        with self.s.lock:
            self.s.conn.execute("BEGIN")
            try:
                self.s.conn.executemany(
                    f"UPDATE jobs SET gpu=? WHERE id=? AND state NOT IN {TERMINAL}",
                    [(g, j) for j, g in placed.items()])
                self.s.conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.s.conn.execute("ROLLBACK")
                raise

    def finish(self, job: str, state: str, *, reason: str = "", at: float) -> bool:
        """Move a job to a terminal state; False (no change) if it already is terminal."""
        if state not in TERMINAL:
            raise StoreError(f"{state!r} is not a terminal state")
        with self.s.lock:
            cur = self.s.conn.execute(
                f"UPDATE jobs SET state=?, reason=?, ended_at=? WHERE id=? AND state NOT IN "
                f"{TERMINAL}", (state, reason, at, job))
            return cur.rowcount == 1
