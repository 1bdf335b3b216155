"""The status snapshot the scheduling loop keeps for readers (the API, ``miso status``, the
page): GPUs (layout, phase, jobs), the queue, and why queued jobs wait (a declined share, a
dependency, a quota, fair share), rebuilt by the loop thread from its scheduling state and
handed over under the runtime's lock (:meth:`LoopView.get`). A GPU's view is rebuilt only
when its state changed; fair-share waits (a pass over the queue) at most every
:data:`FAIR_WAIT_EVERY_S` while events stream in.
"""

from __future__ import annotations

import math
import time
from typing import Any

from miso.controller.runtime import Runtime
from miso.sched import ClusterState
from miso.sched.decisions import RepartitionDeclined
from miso.sched.driver import DriverStep
from miso.sched.fairwait import fair_waits

#: How often (s) the status views' fair-share waits are recomputed while events stream in.
FAIR_WAIT_EVERY_S = 0.5


class LoopView:
    """The loop's snapshot for readers (see the module docstring)."""

    def __init__(self, rt: Runtime, state: ClusterState, step: DriverStep) -> None:
        self.rt = rt
        self.state = state
        self.step = step
        self._snapshot: dict[str, Any] = {"gpus": [], "queue": []}
        #: queued job -> the policy's last declined share for it (RepartitionDeclined)
        self._declined: dict[str, dict[str, Any]] = {}
        self._fair: dict[str, dict[str, Any]] = {}
        self._fair_at = -math.inf
        #: the fair-share waits shown are older than the state (recomputed when idle)
        self.fair_stale = False
        #: per GPU: (what its view was built from, the view), rebuilt only when that changed
        self._gpu_views: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        #: when the snapshot was last built (monotonic) and whether the state changed since
        self.built_at = -math.inf
        self.stale = False

    def get(self) -> dict[str, Any]:
        """GPUs (layout, phase, jobs) and the queue as of the last build."""
        with self.rt.lock:
            return dict(self._snapshot)

    def declined(self, d: RepartitionDeclined) -> None:
        """The policy declined a share for the queued ``d.job``: shown while it waits."""
        self._declined[d.job] = declined_json(d)

    def gpu_changed(self, gpu: str) -> None:
        """``gpu``'s mix or layout changes: the waits declined against it are not current
        any more (the policy records a new one if the job still waits)."""
        if self._declined:
            self._declined = {j: v for j, v in self._declined.items() if v["gpu"] != gpu}

    def _gpu_view(self, gid: str, gs: Any) -> dict[str, Any]:
        """One GPU of the snapshot, rebuilt only when its state changed."""
        ref = self.rt.gpus.get(gid)
        node = ref.node if ref else ""
        key = (gs.phase, gs.layout, tuple(gs.assignment.items()),
               tuple(gs.mps_shares.items()), tuple(gs.jobs), gs.pending_plan_id, node)
        hit = self._gpu_views.get(gid)
        if hit is not None and hit[0] == key:
            return hit[1]
        view = {
            "id": gid, "node": node, "model": gs.model,
            "phase": str(gs.phase), "layout": [str(p) for p in gs.layout],
            "assignment": {j: str(p) for j, p in gs.assignment.items()},
            "mps_shares": dict(gs.mps_shares), "jobs": list(gs.jobs),
            "pending_plan": gs.pending_plan_id,
        }
        self._gpu_views[gid] = (key, view)
        return view

    def update(self, *, fresh: bool = False) -> None:
        """Build the snapshot from the scheduling state now (``fresh``: the fair-share
        waits too, however recent)."""
        held = self.state.gangs.gpus  # GPUs held for gangs: shown too
        gpus = [self._gpu_view(gid, gs) for gid, gs in {**self.state.gpus, **held}.items()]
        if len(self._gpu_views) > 2 * len(gpus) + 16:  # forget removed GPUs
            self._gpu_views = {g["id"]: self._gpu_views[g["id"]] for g in gpus}
        self.built_at, self.stale = time.monotonic(), False
        snap: dict[str, Any] = {"gpus": gpus, "queue": list(self.state.queue)}
        if self._declined:  # only while the job still waits in the queue
            queued = set(self.state.queue)
            self._declined = {j: v for j, v in self._declined.items() if j in queued}
            snap["declined"] = dict(self._declined)
        held = self.step.dependencies.waiting()
        if held:  # held until the jobs named by --after ended
            snap["after"] = {j: list(deps) for j, deps in held.items()}
        ten = self.state.tenancy
        if ten is not None:
            snap["held"] = dict(ten.waiting)      # queued job -> why (over a quota)
            # queued job -> why (fair share): a pass over the queue, so at most every
            # FAIR_WAIT_EVERY_S while events stream in, and when the loop goes idle
            mono = time.monotonic()
            if fresh or mono - self._fair_at >= FAIR_WAIT_EVERY_S:
                self._fair, self._fair_at, self.fair_stale = \
                    _fair_wait_json(self.state), mono, False
            else:
                self.fair_stale = True
            snap["fair_wait"] = self._fair
            counts = _owner_counts(self.state)
            snap["owners"] = {o: {**r, **counts.get(o, {"queued": 0, "running": 0})}
                              for o, r in ten.report(self.state.now).items()}
            if ten.budget is not None:  # the fair slices' regime and budget (fairprice.py)
                snap["fair_slices"] = ten.budget.to_json()
        with self.rt.lock:
            self._snapshot = snap


def declined_json(d: RepartitionDeclined) -> dict[str, Any]:
    """What ``status`` says of a job that waits for a whole GPU rather than share one: the
    GPU, the seconds sharing would save before its restarts and what they cost, and how many
    running jobs they stop (no job ids: a reader may not see others' jobs)."""
    return {"gpu": d.gpu, "gain_s": round(d.gain, 1), "price_s": round(d.price, 1),
            "restarts": len(d.restarts)}


def _fair_wait_json(state: ClusterState) -> dict[str, dict[str, Any]]:
    """:func:`~miso.sched.fairwait.fair_waits` by job, as JSON (one dict per priority and
    owner, shared by its jobs)."""
    out: dict[str, dict[str, Any]] = {}
    for fw, js in fair_waits(state):
        out.update(dict.fromkeys(js, fw.to_json()))
    return out


def _owner_counts(state: ClusterState) -> dict[str, dict[str, int]]:
    """Per owner: jobs queued (not on a GPU) and on a GPU (placed, profiling or running)."""
    out: dict[str, dict[str, int]] = {}
    for j in state.queue:
        n = out.setdefault(state.jobs[j].spec.owner, {"queued": 0, "running": 0})
        n["queued"] += 1
    for gs in state.gpus.values():
        for j in gs.jobs:
            n = out.setdefault(state.jobs[j].spec.owner, {"queued": 0, "running": 0})
            n["running"] += 1
    return out
