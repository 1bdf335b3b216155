"""Jobs' time limits and owners' maximum time, kept durably beside the jobs (their own tables
in the job store's SQLite file, over their own connection, as :mod:`miso.controller.quotas`).

A job's limit is what it asked for (``miso submit --time``) or, without one, its owner's
maximum (a quota, ``miso quota set U --max-time``); asking for more than the maximum is refused
at submission, as Slurm refuses a job over its partition's ``MaxTime``. A job's run time is the
sum of its attempts' (a job requeued by the policy keeps what it used). Past its limit a job is
checkpointed (a job that saves does so) and ended as failed with the reason ``time limit``
(:meth:`miso.controller.loop.EventLoop`); with the operator's ``time_limit_action``
"requeue" (``miso cluster up --at-time-limit requeue``) a job that saves is instead put back
in the queue after its checkpoint and resumes from it, its limit counting per run (a time
slice); a job that cannot save is ended either way.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from miso.timelimit import MAX_TIME_S, format_time

SCHEMA = """
CREATE TABLE IF NOT EXISTS job_time_limit (job TEXT PRIMARY KEY, seconds REAL NOT NULL);
CREATE TABLE IF NOT EXISTS owner_max_time (owner TEXT PRIMARY KEY, seconds REAL NOT NULL);
"""


def check_seconds(s: float, what: str) -> float:
    if isinstance(s, bool) or not isinstance(s, int | float) or not 0 < s <= MAX_TIME_S:
        raise ValueError(f"{what} {s!r}: expected seconds, more than 0 and at most "
                         f"{MAX_TIME_S:g}")
    return float(s)


class TimeLimitStore:
    """The two tables, and the limits of active jobs in memory (the loop reads them often)."""

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None,
                                   timeout=10.0)
        with self._lock:
            self._db.executescript(SCHEMA)
            self._jobs = {str(j): float(s) for j, s in
                          self._db.execute("SELECT job, seconds FROM job_time_limit")}
        #: owners' maximum times read so far (None: none)
        self._max: dict[str, float | None] = {}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def max_time(self, owner: str) -> float | None:
        """``owner``'s maximum (None: none), read once and then kept in memory (it changes
        only through :meth:`set_max_time` of this object: one read less per submission)."""
        if owner in self._max:
            return self._max[owner]
        with self._lock:
            r = self._db.execute("SELECT seconds FROM owner_max_time WHERE owner=?",
                                 (owner,)).fetchone()
            got = None if r is None else float(r[0])
            self._max[owner] = got
        return got

    def set_max_time(self, owner: str, seconds: float | None) -> None:
        with self._lock:
            if seconds is None:
                self._db.execute("DELETE FROM owner_max_time WHERE owner=?", (owner,))
                self._max[owner] = None
            else:
                s = check_seconds(seconds, "max_time_s")
                self._db.execute("INSERT INTO owner_max_time(owner, seconds) VALUES(?, ?) ON "
                                 "CONFLICT(owner) DO UPDATE SET seconds=excluded.seconds",
                                 (owner, s))
                self._max[owner] = s

    def limit_for(self, owner: str, asked: float | None) -> float | None:
        """The limit of a new job of ``owner`` that asked for ``asked`` seconds (None: none);
        ValueError (one line) over the owner's maximum."""
        cap = self.max_time(owner)
        if asked is None:
            return cap
        asked = check_seconds(asked, "time limit")
        if cap is not None and asked > cap:
            raise ValueError(f"time limit {format_time(asked)} is above the maximum of "
                             f"{format_time(cap)} an admin set for this user")
        return asked

    def set_job(self, job: str, seconds: float) -> None:
        with self._lock:
            self._db.execute("INSERT INTO job_time_limit(job, seconds) VALUES(?, ?) ON "
                             "CONFLICT(job) DO UPDATE SET seconds=excluded.seconds",
                             (job, seconds))
            self._jobs[job] = seconds

    def jobs(self) -> dict[str, float]:
        """Every job with a limit (a copy)."""
        with self._lock:
            return dict(self._jobs)

    def forget(self, jobs: Iterable[str]) -> None:
        """Stop watching ``jobs`` (ended); their rows stay for the record."""
        with self._lock:
            for j in jobs:
                self._jobs.pop(j, None)


def run_time(attempts: list[dict[str, Any]], current: int, launched_wall: float,
             now_wall: float) -> float:
    """Seconds a job has run: its ended attempts' (controller clock) and the live one's."""
    past = sum(max(0.0, float(a["ended_at"]) - float(a["started_at"])) for a in attempts
               if a.get("ended_at") is not None and int(a["attempt"]) != current)
    return past + max(0.0, now_wall - launched_wall)


def time_limit_reason(limit: float, used: float, requeue: bool = False) -> str:
    if requeue:
        return (f"time limit {format_time(limit)} reached (ran {format_time(used)} since its "
                f"start): checkpointed and requeued")
    return (f"time limit {format_time(limit)} reached (ran {format_time(used)}): checkpointed "
            f"if it saves, then ended")
