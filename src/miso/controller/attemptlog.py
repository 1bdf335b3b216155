"""The job store's attempts: one row per run of a job on a GPU, from launch to its end.

A part of :class:`~miso.controller.store.JobStore` (over its one connection,
:class:`~miso.controller.storedb.StoreDb`).
"""

from __future__ import annotations

from typing import Any

from miso.controller.storedb import StoreDb


class AttemptLog:
    """The ``attempts`` table."""

    def __init__(self, s: StoreDb) -> None:
        self.s = s

    def new_attempt(self, job: str, *, node: str, gpu: str, placement: str,
                    mps_pct: int | None, resume_iteration: int | None, at: float,
                    restart: bool, at_least: int = 1) -> int:
        """Record a new attempt of ``job`` and return its number (1, 2, ...; at least
        ``at_least``: numbers already used on disk are never handed out again)."""
        with self.s.lock:
            self.s.conn.execute("BEGIN IMMEDIATE")
            try:
                n = max(at_least, int(self.s.conn.execute("SELECT attempts FROM jobs WHERE id=?",
                                                       (job,)).fetchone()[0]) + 1)
                self.s.conn.execute(
                    "UPDATE jobs SET attempts=?, restarts=restarts+? WHERE id=?",
                    (n, 1 if restart else 0, job))
                self.s.conn.execute(
                    "INSERT INTO attempts(job, attempt, node, gpu, placement, mps_pct, "
                    "resume_iteration, started_at) VALUES(?,?,?,?,?,?,?,?)",
                    (job, n, node, gpu, placement, mps_pct, resume_iteration, at))
                self.s.conn.execute("COMMIT")
            except BaseException:
                self.s.conn.execute("ROLLBACK")
                raise
            return n

    def end_attempt(self, job: str, attempt: int, *, status: str, at: float,
                    end_iteration: int | None, checkpoint_iteration: int | None,
                    start_iteration: int | None, log: str | None = None) -> None:
        with self.s.lock:
            self.s.conn.execute(
                "UPDATE attempts SET status=?, ended_at=?, end_iteration=?, "
                "checkpoint_iteration=?, start_iteration=COALESCE(?, start_iteration), "
                "log=COALESCE(?, log) WHERE job=? AND attempt=? AND ended_at IS NULL",
                (status, at, end_iteration, checkpoint_iteration, start_iteration, log, job,
                 attempt))

    def attempts(self, job: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM attempts", ()
        if job is not None:
            q, args = q + " WHERE job=?", (job,)
        with self.s.lock:
            return [dict(r) for r in self.s.conn.execute(q + " ORDER BY job, attempt", args)]

    def open_attempts(self) -> list[dict[str, Any]]:
        """Attempts with no recorded end."""
        with self.s.lock:
            return [dict(r) for r in self.s.conn.execute(
                "SELECT * FROM attempts WHERE ended_at IS NULL ORDER BY job, attempt")]
