"""Writing submitted jobs to the store in groups: a group commit.

Submissions arrive from many API threads at once while the store's one connection (and its
lock) is shared with the poller, the GPU workers and the loop. One transaction per submission
made each of them wait for the lock and commit alone; here each submission is queued, and
whichever thread gets the lock writes every submission waiting then in one transaction (one
``next_job`` read and write, one commit; each new record is built from the values written,
not read back), and hands each caller its record or its error. A lone submission is a group
of one: the same checks, the same rows, the same ids in the order the group was taken.

A submission's checks (a known ``request_id``, a name in use) run inside the group's
transaction, so a later submission of the group sees the rows of the earlier ones; one
refused submission does not fail the others.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miso.controller.schema import NAME_FREED, TERMINAL, JobRecord, StoreConflict, StoreError
from miso.controller.storedb import StoreDb
from miso.jobstatus import JobStatus


@dataclass
class Pending:
    """One submission waiting for its group: the row's values and, once written, its
    outcome (the new or earlier job's id, or the error to raise in the caller)."""

    row: dict[str, Any]
    #: checks a known ``request_id``'s job against this request (raises StoreConflict)
    same_request: Callable[[JobRecord], None]
    job: str | None = None
    record: JobRecord | None = None
    error: BaseException | None = None
    done: bool = False


class GroupWriter:
    """The queue of submissions waiting for the store's lock (see the module docstring)."""

    def __init__(self, s: StoreDb, read: Callable[[list[str]], dict[str, JobRecord]]) -> None:
        self.s = s
        #: the records of some job ids, read under the store's lock
        self.read = read
        self._mutex = threading.Lock()
        self._waiting: list[Pending] = []

    def waiting(self) -> int:
        """How many submissions wait for the next group."""
        with self._mutex:
            return len(self._waiting)

    def write(self, p: Pending) -> JobRecord:
        """Queue ``p``, write it (with whatever else waits) once the store's lock is free,
        and return its record; raises its error."""
        with self._mutex:
            self._waiting.append(p)
        with self.s.lock:
            if not p.done:
                with self._mutex:
                    group, self._waiting = self._waiting, []
                self._write_group(group)
        if p.error is not None:
            raise p.error
        assert p.record is not None
        return p.record

    def _write_group(self, group: list[Pending]) -> None:
        """Write ``group`` in one transaction (the caller holds the store's lock)."""
        conn = self.s.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                n0 = n = int(self.s.meta("next_job") or 1)
                for p in group:
                    n = self._one(p, n)
                if n != n0:
                    self.s.set_meta("next_job", str(n))
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as e:
            err = StoreError(f"cannot record the job in {self.s.path}: {e}")
            for p in group:
                if p.error is None:
                    p.job, p.error = None, err
        except BaseException as e:  # noqa: BLE001 - every caller of the group gets it
            for p in group:
                if p.error is None:
                    p.job, p.error = None, e
        finally:
            for p in group:
                p.done = True

    def _one(self, p: Pending, n: int) -> int:
        """Check and insert one submission as job number ``n``; the next free number."""
        conn, r = self.s.conn, p.row
        if r["request_id"] is not None:
            old = conn.execute("SELECT id FROM jobs WHERE request_id=?",
                               (r["request_id"],)).fetchone()
            if old is not None:
                rec = self.read([str(old[0])]).get(str(old[0]))
                if rec is None:
                    p.error = StoreError(f"the store's record of job {old[0]!r} is malformed")
                    return n
                try:
                    p.same_request(rec)
                    p.job, p.record = rec.id, rec
                except StoreError as e:
                    p.error = e
                return n
        jid = f"j{n:04d}"
        name = r["name"] or jid
        dup = conn.execute("SELECT id, state FROM jobs WHERE (name=? AND owner IS ?) OR id=? "
                           "ORDER BY seq DESC", (name, r["owner"], name)).fetchone()
        if dup is not None and (dup[0] == name or dup[1] not in NAME_FREED):
            what = f"is already active ({dup[0]})" if dup[1] not in TERMINAL \
                else f"already exists ({dup[0]}, {dup[1]})"
            p.error = StoreError(f"a job named {name!r} {what}; names are unique among "
                                 "active and finished jobs: choose another")
            return n
        command, env = json.dumps(r["command"]), json.dumps(r["env"])
        after = json.dumps(r["after"]) if r["after"] else None
        at = float(time.time() - self.s.epoch if r["at"] is None else r["at"])
        conn.execute(
            "INSERT INTO jobs(id, name, command, memory_gb, memory_gib, workload, env, cwd, "
            "state, submitted_at, owner, unix_user, request_id, owner_name, host_memory_gb, "
            "num_gpus, nodes, mig_profile, after_jobs) "
            "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (jid, name, command, r["memory_gb"], r["memory_gib"], r["workload"], env,
             r["cwd"], JobStatus.QUEUED.value, at, r["owner"], r["unix_user"],
             r["request_id"], r["owner_name"], r["host_memory_gb"], r["num_gpus"],
             r["nodes"], r["profile"], after))
        p.job = jid
        p.record = new_record(jid, name, r, command, env, after, at)
        return n + 1


def _real(x: Any) -> float | None:
    return None if x is None else float(x)


def new_record(jid: str, name: str, r: dict[str, Any], command: str, env: str,
               after: str | None, at: float) -> JobRecord:
    """The record of a job just inserted from row ``r`` (its JSON columns as written), as
    reading the row back would give it: a fresh job's other columns hold their defaults.
    Built here instead of read back: one query fewer per group, and no row to decode."""
    return JobRecord(
        id=jid, name=name, command=[str(c) for c in json.loads(command)],
        memory_gb=float(r["memory_gb"]), workload=r["workload"], env=json.loads(env),
        cwd=r["cwd"], state=JobStatus.QUEUED.value, reason="", submitted_at=at,
        started_at=None, ended_at=None, gpu=None, placement=None, mps_pct=None, attempts=0,
        restarts=0, iteration=None, total=None, rate=None, checkpoint_iteration=None,
        checkpoint_path=None, owner=r["owner"], unix_user=r["unix_user"],
        owner_name=r["owner_name"], request_id=r["request_id"],
        memory_gib=_real(r["memory_gib"]), checkpointable=None, note="",
        host_memory_gb=_real(r["host_memory_gb"]),
        num_gpus=None if r["num_gpus"] is None else int(r["num_gpus"]),
        nodes=None if r["nodes"] is None else int(r["nodes"]), profile=r["profile"],
        after=None if after is None else json.loads(after))


def conflict_check(request_id: str, differs: Callable[[JobRecord], list[str]]
                   ) -> Callable[[JobRecord], None]:
    """The check of a retried submission against the job its ``request_id`` made: a
    :class:`StoreConflict` naming the fields that differ."""

    def check(rec: JobRecord) -> None:
        bad = differs(rec)
        if bad:
            raise StoreConflict(
                f"request_id {request_id.split(':', 1)[-1]!r} was used for job {rec.id} with "
                f"another {', '.join(bad)}: a retry must repeat the request; use a new "
                "request_id for a new job")
    return check
