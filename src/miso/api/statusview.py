"""What ``GET /api/v1/status`` assembles besides the user's job records: the cluster snapshot
re-read at most every few seconds, the summary of a big cluster (counts only), and one GPU as
a user may see it (others' jobs as a count). Used by :mod:`miso.api.app`.

The summary (what ``miso status`` shows first) is answered without waiting: its cluster half
(GPUs by phase, nodes, queue length, errors) and every owner's job counts (one SQL read on
the store's read connection) are computed when the snapshot is refreshed, off the API's
event loop, and a request only picks the user's row. In a controller process whose threads
(pollers, GPU workers, the decision loop) keep the interpreter lock busy, every blocking
call or SQL row on the request path is a wait for that lock of milliseconds; the summary's
path has none.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from miso.api.app import ControllerLike


@dataclass(frozen=True)
class SummaryPart:
    """What the summary shows of the cluster and of everyone's jobs, computed once per
    snapshot (``at``: monotonic time the snapshot's reads began)."""

    at: float
    cluster: dict[str, Any]
    errors: list[str]
    by_owner: dict[str | None, dict[str, int]] = field(default_factory=dict)
    #: everyone's counts (the sum of ``by_owner``)
    everyone: dict[str, int] = field(default_factory=dict)


def summary_part(snap: dict[str, Any], by_owner: dict[str | None, dict[str, int]],
                 at: float) -> SummaryPart:
    """The summary's cluster half of ``snap`` (GPUs by phase, nodes, queue length)."""
    phases: dict[str, int] = {}
    for g in snap.get("gpus", []):
        ph = str(g.get("phase"))
        phases[ph] = phases.get(ph, 0) + 1
    cluster = {"time": snap.get("time"), "policy": snap.get("policy"),
               "nodes": len(snap.get("nodes", [])), "lost_nodes": snap.get("lost_nodes", []),
               "gpus": len(snap.get("gpus", [])), "gpu_phases": phases,
               "queue": len(snap.get("queue", []))}
    return SummaryPart(at, cluster, list(snap.get("errors", [])), by_owner,
                       snap.get("counts") or _total(by_owner))


def _total(by_owner: dict[str | None, dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in by_owner.values():
        for st, n in c.items():
            out[st] = out.get(st, 0) + n
    return dict(sorted(out.items()))


class ClusterSnapshot:
    """The controller's cluster snapshot and the job counts of everyone (counted in SQL on
    the store's read connection), re-read at most every ``ttl`` seconds (a cluster view;
    each user's own job records are always read fresh by the page).

    The summary's half (:class:`SummaryPart`) is kept beside it: :meth:`summary_part`
    answers at once with the last one while it is at most :attr:`stale_s` old and the user
    wrote nothing through the API since it was read (the caller then refreshes it in the
    background once it is older than ``ttl``), else None (the caller refreshes it with
    :meth:`fresh_summary` off the event loop)."""

    def __init__(self, ctl: ControllerLike, ttl: float, stale_s: float | None = None) -> None:
        self.ctl, self.ttl = ctl, ttl
        #: how old a summary may be answered while a newer one is read (0 with ``ttl`` 0)
        self.stale_s = (max(ttl, 1.0) if ttl > 0 else 0.0) if stale_s is None else stale_s
        self._lock = threading.Lock()  # one refresh at a time
        self._at = -math.inf
        self._snap: dict[str, Any] = {}
        self._part: SummaryPart | None = None
        #: user id -> monotonic time its last submit or cancel through the API ended
        self._wrote: dict[str, float] = {}

    def _refresh(self) -> None:
        """Read the snapshot and the counts now (the caller holds :attr:`_lock`)."""
        t0 = time.monotonic()
        snap = self.ctl.cluster()
        store = self.ctl.store
        reads = getattr(store, "reads", store)
        by_owner = reads.counts_by_owner()
        snap["counts"] = _total(by_owner)
        self._snap, self._part = snap, summary_part(snap, by_owner, t0)
        self._at = t0

    def get(self) -> dict[str, Any]:
        """The snapshot, at most ``ttl`` old (read now, under the lock, when older)."""
        with self._lock:
            if time.monotonic() - self._at > self.ttl:
                self._refresh()
            return self._snap

    # ---- the summary --------------------------------------------------------------------

    def wrote(self, user_id: str) -> None:
        """``user_id`` changed its jobs through the API: its next summary reads anew."""
        self._wrote[user_id] = time.monotonic()

    def summary_part(self, user_id: str) -> SummaryPart | None:
        """The last summary part when it may answer ``user_id`` now (see the class), else
        None. Never blocks."""
        part = self._part
        if part is None or self._wrote.get(user_id, -math.inf) >= part.at:
            return None
        return part if time.monotonic() - part.at <= self.stale_s else None

    def due(self) -> bool:
        """The summary part is older than ``ttl`` and no refresh runs."""
        return time.monotonic() - self._at > self.ttl and not self._lock.locked()

    def refresh_if_due(self) -> None:
        """Refresh when older than ``ttl``, unless a refresh runs already (background)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if time.monotonic() - self._at > self.ttl:
                self._refresh()
        finally:
            self._lock.release()

    def fresh_summary(self, user_id: str) -> SummaryPart:
        """A summary part read after ``user_id``'s last write and at most ``ttl`` old
        (blocks: a thread of the pool, not the event loop)."""
        with self._lock:
            part = self._part
            if part is None or time.monotonic() - part.at > self.ttl or \
                    self._wrote.get(user_id, -math.inf) >= part.at:
                self._refresh()
                part = self._part
            assert part is not None
            return part


def status_summary(part: SummaryPart, user: Any, api_url: str | None) -> dict[str, Any]:
    """What ``miso status`` shows first, at any size: job counts by state (the user's, and
    everyone's, counted in SQL), GPUs by phase, nodes, queue length; no job or GPU list."""
    out: dict[str, Any] = {
        "api_url": api_url, "user": user.name, "admin": user.admin, "summary": True,
        **part.cluster,
        "counts": {"mine": part.by_owner.get(user.id, {}), "all": part.everyone}}
    if user.admin:
        out["errors"] = part.errors
    return out


def gpu_view(gpu: dict[str, Any], mine: set[str] | None) -> dict[str, Any]:
    """One GPU of the snapshot as a user sees it: own jobs by id, the others as a count
    (``mine`` None: everything, for admins)."""
    if mine is None:
        return {**gpu, "other_jobs": 0}
    jobs = [j for j in gpu.get("jobs", []) if j in mine]
    return {**gpu, "jobs": jobs,
            "assignment": {j: p for j, p in gpu.get("assignment", {}).items() if j in mine},
            "mps_shares": {j: s for j, s in gpu.get("mps_shares", {}).items() if j in mine},
            "other_jobs": len(gpu.get("jobs", [])) - len(jobs)}
