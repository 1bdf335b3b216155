"""Owners' fair-share weights and quotas, and jobs' priorities, kept durably beside the jobs.

The tables (``quotas``, ``job_priority``) are :data:`miso.controller.schema.TENANCY_SCHEMA`, in
the job store's SQLite file; this class reads and writes them over its own connection (WAL:
readers and the job store's writer do not block each other), so the job store itself does not
grow. An owner is an API user's id (:mod:`miso.api.users`; a re-created name is a new owner);
``name`` is kept for display only.

:func:`tenancy_config` turns the stored rows into the :class:`~miso.sched.tenancy.TenancyConfig`
the scheduling core reads; the controller hands it to its loop at every change, so the next
decision uses it (no restart).
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from miso.controller.schema import TENANCY_SCHEMA
from miso.sched.fairprice import DEFAULT_PRICE
from miso.sched.tenancyconfig import MAX_FAIRNESS_PRICE, TenancyConfig

#: Bounds of what an admin may store (one-line ValueError beyond them).
MIN_WEIGHT = 1e-3         # a ratio of 1e6 between two owners at most: the fair-share math
MAX_WEIGHT = 1e3          # stays far from underflow, and no owner's share rounds to nothing
MAX_IN_USE = 1e6          # GPU-equivalents
MAX_QUEUED = 10_000_000   # jobs
MAX_PRIORITY = 1_000_000  # |priority|, and |priority limit|

#: The fields of a quota an admin sets (None: the default, no limit).
FIELDS = ("weight", "max_in_use", "max_queued", "priority_limit")


@dataclass(frozen=True)
class Quota:
    """One owner's row: weight (fair-share entitlement, default 1), GPU-equivalents it may hold
    at once, jobs it may have queued, and the highest priority its jobs may ask for (None: a
    non-admin may ask for ``normal`` or lower; admins for anything)."""

    owner: str
    name: str
    weight: float | None = None
    max_in_use: float | None = None
    max_queued: int | None = None
    priority_limit: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def empty(self) -> bool:
        return all(getattr(self, f) is None for f in FIELDS)


def check_priority(p: int) -> int:
    """``p`` when within ±:data:`MAX_PRIORITY`, else a one-line ValueError."""
    if isinstance(p, bool) or not isinstance(p, int) or abs(p) > MAX_PRIORITY:
        raise ValueError(f"priority {p!r}: expected an integer within ±{MAX_PRIORITY}")
    return p


#: An account's name: what `miso quota account NAME` takes.
ACCOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_account(name: str) -> str:
    """``name`` when it is a valid account name, else a one-line ValueError."""
    if not isinstance(name, str) or not ACCOUNT_NAME.fullmatch(name):
        raise ValueError(f"account {name!r}: expected 1-64 letters, digits, '.', '_' or '-', "
                         f"starting with a letter or digit")
    return name


def check_price(p: float) -> float:
    """``p`` when it is a fairness price an operator may state, else a one-line ValueError."""
    if isinstance(p, bool) or not isinstance(p, int | float) or not math.isfinite(p) \
            or not 0 <= p <= MAX_FAIRNESS_PRICE:
        raise ValueError(f"fairness price {p!r}: expected a share from 0 to "
                         f"{MAX_FAIRNESS_PRICE:g} (0.05: 5 %)")
    return float(p)


def with_price(base: TenancyConfig | None, quotas: QuotaStore, stored: bool
               ) -> TenancyConfig | None:
    """``base`` with its fairness price settled against the store: a price stated now is
    kept for the next starts; ``stored`` (fair share with neither a price nor a fixed
    ``--demand-per-job`` given) takes the kept one, else the default
    (:data:`~miso.sched.fairprice.DEFAULT_PRICE`)."""
    if base is None or not base.fair_share:
        return base
    if base.fairness_price is not None:
        quotas.set_fairness_price(base.fairness_price)
        return base
    if stored:
        kept = quotas.fairness_price()
        return replace(base, fairness_price=DEFAULT_PRICE if kept is None else kept)
    return base


def check_quota(q: Quota) -> Quota:
    """``q`` when every field is within its bounds, else a one-line ValueError."""
    if q.weight is not None and (isinstance(q.weight, bool)
                                 or not isinstance(q.weight, int | float)
                                 or not MIN_WEIGHT <= q.weight <= MAX_WEIGHT):
        raise ValueError(f"weight {q.weight!r}: expected a number from {MIN_WEIGHT:g} to "
                         f"{MAX_WEIGHT:g}")
    if q.max_in_use is not None and not (math.isfinite(q.max_in_use)
                                         and 0 <= q.max_in_use <= MAX_IN_USE):
        raise ValueError(f"max_in_use {q.max_in_use!r}: expected GPU-equivalents from 0 to "
                         f"{MAX_IN_USE:g}")
    if q.max_queued is not None and (isinstance(q.max_queued, bool)
                                     or not 0 <= q.max_queued <= MAX_QUEUED):
        raise ValueError(f"max_queued {q.max_queued!r}: expected jobs from 0 to {MAX_QUEUED}")
    if q.priority_limit is not None:
        check_priority(q.priority_limit)
    return q


class QuotaStore:
    """The ``quotas`` and ``job_priority`` tables of the job store at ``path`` (``":memory:"``:
    a private throw-away database, as the job store's own)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=10.0)
        self._db.row_factory = sqlite3.Row
        with self._lock:
            self._db.executescript(TENANCY_SCHEMA)
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, "
                             "value TEXT NOT NULL)")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- quotas -------------------------------------------------------------------------

    def list(self) -> list[Quota]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM quotas ORDER BY name, owner").fetchall()
        return [_quota(r) for r in rows]

    def get(self, owner: str) -> Quota | None:
        with self._lock:
            r = self._db.execute("SELECT * FROM quotas WHERE owner=?", (owner,)).fetchone()
        return _quota(r) if r is not None else None

    def set(self, owner: str, name: str, **fields: Any) -> Quota:
        """Set the given ``fields`` (:data:`FIELDS`; a None value clears one) of ``owner``'s
        row, keeping the others; returns the row. ValueError on an unknown field or a value
        out of bounds (nothing is written then)."""
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown quota field(s): {', '.join(sorted(unknown))}")
        old = self.get(owner) or Quota(owner, name)
        new = check_quota(replace(old, name=name, **fields))
        with self._lock:
            if new.empty:
                self._db.execute("DELETE FROM quotas WHERE owner=?", (owner,))
            else:
                self._db.execute(
                    "INSERT INTO quotas(owner, name, weight, max_in_use, max_queued, "
                    "priority_limit, updated_at) VALUES(?,?,?,?,?,?,?) ON CONFLICT(owner) DO "
                    "UPDATE SET name=excluded.name, weight=excluded.weight, "
                    "max_in_use=excluded.max_in_use, max_queued=excluded.max_queued, "
                    "priority_limit=excluded.priority_limit, updated_at=excluded.updated_at",
                    (owner, name, new.weight, new.max_in_use, new.max_queued,
                     new.priority_limit, time.time()))
        return new

    def clear(self, owner: str) -> bool:
        """Forget ``owner``'s row (defaults again); False when it had none."""
        with self._lock:
            return self._db.execute("DELETE FROM quotas WHERE owner=?",
                                    (owner,)).rowcount > 0

    # ---- accounts above owners (Slurm's association tree, two levels) ----------------------

    def accounts(self) -> tuple[dict[str, str], dict[str, float]]:
        """(owner -> its account, account -> its weight; accounts without a stored weight
        have the default)."""
        with self._lock:
            members = {str(r[0]): str(r[1]) for r in self._db.execute(
                "SELECT owner, account FROM account_members")}
            weights = {str(r[0]): float(r[1]) for r in self._db.execute(
                "SELECT name, weight FROM accounts")}
        return members, weights

    def set_account(self, owner: str, account: str | None) -> None:
        """Put ``owner`` in ``account`` (None: in none, its own account again)."""
        if account is not None:
            check_account(account)
        with self._lock:
            if account is None:
                self._db.execute("DELETE FROM account_members WHERE owner=?", (owner,))
            else:
                self._db.execute("INSERT INTO account_members(owner, account) VALUES(?, ?) ON "
                                 "CONFLICT(owner) DO UPDATE SET account=excluded.account",
                                 (owner, account))

    def set_account_weight(self, account: str, weight: float | None) -> None:
        """Set ``account``'s fair-share weight (None: the default again); ValueError out of
        bounds."""
        check_account(account)
        if weight is not None:
            check_quota(Quota("", "", weight=weight))
        with self._lock:
            if weight is None:
                self._db.execute("DELETE FROM accounts WHERE name=?", (account,))
            else:
                self._db.execute("INSERT INTO accounts(name, weight) VALUES(?, ?) ON "
                                 "CONFLICT(name) DO UPDATE SET weight=excluded.weight",
                                 (account, float(weight)))

    # ---- the cluster's fairness price ----------------------------------------------------

    def fairness_price(self) -> float | None:
        """The fairness price last stated for this cluster (``cluster up --fairness-price``),
        or None."""
        with self._lock:
            r = self._db.execute("SELECT value FROM meta WHERE key='fairness_price'").fetchone()
        try:
            return None if r is None else check_price(float(r[0]))
        except ValueError:
            return None

    def set_fairness_price(self, price: float) -> None:
        """Keep ``price`` as this cluster's fairness price (ValueError out of bounds)."""
        check_price(price)
        with self._lock:
            self._db.execute("INSERT INTO meta(key, value) VALUES('fairness_price', ?) ON "
                             "CONFLICT(key) DO UPDATE SET value=excluded.value", (repr(price),))

    # ---- priorities ---------------------------------------------------------------------

    def set_priority(self, job: str, priority: int) -> None:
        """Record a job's priority (0, ``normal``, is the default and is not stored)."""
        check_priority(priority)
        if priority == 0:
            return
        with self._lock:
            self._db.execute("INSERT INTO job_priority(job, priority) VALUES(?, ?) ON "
                             "CONFLICT(job) DO UPDATE SET priority=excluded.priority",
                             (job, priority))

    def priorities(self, jobs: Iterable[str]) -> dict[str, int]:
        """The priority of each of ``jobs`` that has one other than 0."""
        ids = list(jobs)
        out: dict[str, int] = {}
        with self._lock:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                marks = ",".join("?" * len(part))
                out.update((str(r[0]), int(r[1])) for r in self._db.execute(
                    f"SELECT job, priority FROM job_priority WHERE job IN ({marks})", part))
        return out


def _quota(r: sqlite3.Row) -> Quota:
    return Quota(str(r["owner"]), str(r["name"]),
                 None if r["weight"] is None else float(r["weight"]),
                 None if r["max_in_use"] is None else float(r["max_in_use"]),
                 None if r["max_queued"] is None else int(r["max_queued"]),
                 None if r["priority_limit"] is None else int(r["priority_limit"]))


def tenancy_config(base: TenancyConfig | None, quotas: Iterable[Quota],
                   accounts: tuple[dict[str, str], dict[str, float]] | None = None,
                   ) -> TenancyConfig | None:
    """``base`` (the operator's ``--fair-share`` options) with the stored weights and quotas
    over its own, and the stored ``accounts`` (owner -> account, account -> weight); None (a
    plain FIFO queue) when there is neither. Stored quotas alone turn tenancy on without fair
    share (quotas and priorities, FIFO otherwise)."""
    qs = list(quotas)
    if accounts is not None and accounts[0] and base is not None:
        base = replace(base, accounts={**base.accounts, **accounts[0]},
                       account_weights={**base.account_weights, **accounts[1]})
    if base is None and not any(q.weight is not None or q.max_in_use is not None
                                or q.max_queued is not None for q in qs):
        return None
    base = base if base is not None else TenancyConfig(fair_share=False)
    weights = dict(base.weights)
    in_use = dict(base.max_in_use)
    queued = dict(base.max_queued)
    for q in qs:
        for table, v in ((weights, q.weight), (in_use, q.max_in_use), (queued, q.max_queued)):
            if v is not None:
                table[q.owner] = v
    return replace(base, weights=weights, max_in_use=in_use, max_queued=queued)
