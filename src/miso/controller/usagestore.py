"""Owners' decayed usage kept in the job store, so that a restart (crash recovery, ``miso
cluster down/up``) keeps who used what: a heavy user's fair-share debt is not wiped.

The ``owner_usage`` table (:data:`miso.controller.schema.TENANCY_SCHEMA`) holds one
:class:`~miso.sched.tenancy.UsageRecord` per owner: its usage as of the last change of any
owner's charge and its charge since. The event loop writes the ledger whenever a charge
changes (a placement, a layout, an end), which is exact: between two changes the ledger
follows from those numbers alone. Rebuilding it from the attempt history instead would miss
what the core charges outside attempts (a job resident while its GPU is profiled or
repartitioned) and would need each GPU's model and every MPS share over time.

At start the controller settles every record at the time of its recovery (the jobs kept their
charge until recovery stopped them: a crashed controller's jobs ran on) and hands them to the
core (:meth:`~miso.sched.tenancy.Tenancy.restore`); a clean stop that stops the jobs settles
them at once, so the time the cluster is down is not charged.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

from miso.controller.schema import TENANCY_SCHEMA
from miso.sched.tenancy import UsageRecord


class UsageStore:
    """The ``owner_usage`` table of the job store at ``path`` (``":memory:"``: a private
    throw-away database, as the job store's own)."""

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None,
                                   timeout=10.0)
        self._db.row_factory = sqlite3.Row
        with self._lock:
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints
            self._db.executescript(TENANCY_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def load(self) -> list[UsageRecord]:
        """Every owner's last record (rows that are not finite numbers are left out)."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM owner_usage ORDER BY owner").fetchall()
        out = []
        for r in rows:
            try:
                rec = UsageRecord(str(r["owner"]), float(r["usage"]), float(r["total"]),
                                  float(r["rate"]), float(r["as_of"]), float(r["half_life_s"]))
            except (TypeError, ValueError):
                continue
            nums = (rec.usage, rec.total, rec.rate, rec.as_of, rec.half_life_s)
            if all(math.isfinite(x) for x in nums) and rec.half_life_s > 0:
                out.append(rec)
        return out

    def save(self, records: Iterable[UsageRecord]) -> None:
        """Write ``records`` (one transaction; owners not named keep their rows)."""
        rows = [(r.owner, r.usage, r.total, r.rate, r.as_of, r.half_life_s) for r in records]
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO owner_usage(owner, usage, total, rate, as_of, half_life_s) "
                    "VALUES(?,?,?,?,?,?) ON CONFLICT(owner) DO UPDATE SET "
                    "usage=excluded.usage, total=excluded.total, rate=excluded.rate, "
                    "as_of=excluded.as_of, half_life_s=excluded.half_life_s", rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def settle(self, t: float) -> list[UsageRecord]:
        """Settle every record at ``t`` (its owner's jobs stopped then), write them, and
        return them."""
        recs = [r.settled(t) for r in self.load()]
        self.save(recs)
        return recs
