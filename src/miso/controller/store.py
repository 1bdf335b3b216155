"""Durable job store (SQLite, schema-versioned): jobs, their attempts, applied layouts, events.

:class:`JobStore` is a facade over parts that share one connection, one per role:

* :class:`~miso.controller.storedb.StoreDb` (``storedb.py``): the connection and its lock,
  opening and migrating the schema, the ``meta`` table (epoch, lease horizon), backups;
* :class:`~miso.controller.jobtable.JobTable` (``jobtable.py``): jobs and their states;
* :class:`~miso.controller.attemptlog.AttemptLog` (``attemptlog.py``): a job's attempts;
* :class:`~miso.controller.eventlog.EventLog` (``eventlog.py``): layouts and events.

Callers use the facade's methods (one name each, the part's); a new table gets a new part.

Job states (:class:`~miso.jobstatus.JobStatus`): ``queued`` (waiting, or resident on a GPU but
not running), ``profiling`` (running under MPS to be profiled), ``running``, ``checkpointing``
(asked to save and stop), ``finished``, ``failed``, ``cancelled``. Terminal states never change
again, which is what makes "every job finishes exactly once" checkable: :meth:`JobStore.finish`
is a conditional update.

Memory: ``memory_gb`` is what the user asked for, in GB (10^9 bytes); ``memory_gib`` is the
same amount in GiB (2^30 bytes), the unit of MIG profiles, and the one scheduling uses.

Damage: :func:`miso.controller.storefile.open_store` refuses (one-line :class:`StoreError`) a
store that is missing, empty or unreadable in a state directory that held one before, and says
how to recover. A row that cannot be read is skipped (listed in :attr:`JobStore.bad_rows`), not
fatal. The schema, the job states and :class:`JobRecord` are :mod:`miso.controller.schema`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from miso.controller.attemptlog import AttemptLog
from miso.controller.eventlog import EventLog
from miso.controller.jobtable import JobTable
from miso.controller.schema import GIB_PER_GB, JobRecord, StoreConflict, StoreError
from miso.controller.storedb import ReadDb, StoreDb

__all__ = ["GIB_PER_GB", "JobRecord", "JobStore", "StoreConflict", "StoreError"]


def _part(role: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The facade's method that is ``fn`` of its part ``role`` (same name and docstring)."""

    @functools.wraps(fn)
    def method(self: JobStore, *args: Any, **kwargs: Any) -> Any:
        return fn(getattr(self, role), *args, **kwargs)

    return method


class JobStore:
    """SQLite-backed store; ``path=":memory:"`` for a throw-away store."""

    def __init__(self, path: str | Path, *, first_id: int = 1) -> None:
        #: the one connection (its ``conn`` and ``lock``) every part uses
        self.db = StoreDb(path, first_id=first_id)
        self.path = self.db.path
        self.table = JobTable(self.db)
        self.attempt_log = AttemptLog(self.db)
        self.event_log = EventLog(self.db)
        #: the jobs' reads on a second connection (:class:`~miso.controller.storedb.ReadDb`)
        #: that never waits for a writer: for readers that only show (the API's status and
        #: lists); the store itself for a throw-away store
        self.reads: JobTable | JobStore = self
        if self.path != ":memory:":
            self._read_db = ReadDb(self.db)
            self.reads = JobTable(self._read_db)  # type: ignore[arg-type]

    # ---- the store itself ---------------------------------------------------------------

    backup = _part("db", StoreDb.backup)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the store's lock across several writes (each part's own hold inside is
        re-entrant): a thread that writes twice waits for the lock once, behind the
        pollers, the GPU workers and the API, instead of once per write."""
        with self.db.lock:
            yield

    def close(self) -> None:
        if self.reads is not self:
            self._read_db.close()
        self.db.close()

    @property
    def epoch(self) -> float:
        return self.db.epoch

    @property
    def lease_horizon(self) -> float:
        return self.db.lease_horizon

    @lease_horizon.setter
    def lease_horizon(self, t: float) -> None:
        self.db.lease_horizon = t

    @property
    def schema_version(self) -> int:
        return self.db.schema_version

    @property
    def bad_rows(self) -> list[str]:
        """Job ids whose rows could not be read (skipped by :meth:`jobs`)."""
        return self.table.bad_rows

    # ---- jobs ---------------------------------------------------------------------------

    submit = _part("table", JobTable.submit)
    get = _part("table", JobTable.get)
    jobs = _part("table", JobTable.jobs)
    counts = _part("table", JobTable.counts)
    counts_by_owner = _part("table", JobTable.counts_by_owner)
    brief = _part("table", JobTable.brief)
    owners = _part("table", JobTable.owners)
    pinned = _part("table", JobTable.pinned)
    owner_rows = _part("table", JobTable.owner_rows)
    set_owner = _part("table", JobTable.set_owner)
    job_ids = _part("table", JobTable.job_ids)
    update = _part("table", JobTable.update)
    progress = _part("table", JobTable.progress)
    progress_many = _part("table", JobTable.progress_many)
    finish = _part("table", JobTable.finish)
    place_many = _part("table", JobTable.place_many)

    # ---- attempts -----------------------------------------------------------------------

    new_attempt = _part("attempt_log", AttemptLog.new_attempt)
    end_attempt = _part("attempt_log", AttemptLog.end_attempt)
    attempts = _part("attempt_log", AttemptLog.attempts)
    open_attempts = _part("attempt_log", AttemptLog.open_attempts)

    # ---- layouts and events -------------------------------------------------------------

    record_layout = _part("event_log", EventLog.record_layout)
    layouts = _part("event_log", EventLog.layouts)
    log_event = _part("event_log", EventLog.log_event)
    log_events = _part("event_log", EventLog.log_events)
    events = _part("event_log", EventLog.events)
