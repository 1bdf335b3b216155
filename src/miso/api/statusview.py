"""What ``GET /api/v1/status`` assembles besides the user's job records: the cluster snapshot
re-read at most every few seconds, the summary of a big cluster (counts only), and one GPU as
a user may see it (others' jobs as a count). Used by :mod:`miso.api.app`."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from miso.api.app import ControllerLike


class ClusterSnapshot:
    """The controller's cluster snapshot and the job counts of everyone (counted in SQL on
    the store's read connection), re-read at most every ``ttl`` seconds (a cluster view;
    each user's own jobs are always read fresh)."""

    def __init__(self, ctl: ControllerLike, ttl: float) -> None:
        self.ctl, self.ttl = ctl, ttl
        self._lock = threading.Lock()
        self._at = 0.0
        self._snap: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        with self._lock:
            if time.monotonic() - self._at > self.ttl:
                snap = self.ctl.cluster()
                store = self.ctl.store
                snap["counts"] = getattr(store, "reads", store).counts()
                self._snap, self._at = snap, time.monotonic()
            return self._snap


def status_summary(snap: dict[str, Any], user: Any, mine: dict[str, int],
                   api_url: str | None) -> dict[str, Any]:
    """What ``miso status`` shows first, at any size: job counts by state (the user's, and
    everyone's from the snapshot, counted in SQL), GPUs by phase, nodes, queue length; no job
    or GPU list."""
    phases: dict[str, int] = {}
    for g in snap.get("gpus", []):
        phases[str(g.get("phase"))] = phases.get(str(g.get("phase")), 0) + 1
    out: dict[str, Any] = {
        "api_url": api_url, "user": user.name, "admin": user.admin, "summary": True,
        "time": snap.get("time"), "policy": snap.get("policy"),
        "nodes": len(snap.get("nodes", [])), "lost_nodes": snap.get("lost_nodes", []),
        "gpus": len(snap.get("gpus", [])), "gpu_phases": phases,
        "queue": len(snap.get("queue", [])),
        "counts": {"mine": mine, "all": snap.get("counts", {})}}
    if user.admin:
        out["errors"] = snap.get("errors", [])
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
