"""What the live controller shows: the cluster (GPUs, queue, nodes, owners against their
entitlement, errors), every job with one line on why it waits, and a job's output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from miso.controller.loop import EventLoop
from miso.controller.owners import owner_table
from miso.controller.quotas import QuotaStore
from miso.controller.runtime import Runtime
from miso.controller.statustext import (
    NO_NODES,
    SnapIndex,
    fair_named,
    lost_node,
    owner_named,
    why,
)
from miso.controller.store import JobStore
from miso.jobstatus import JobStatus
from miso.nodeerrors import NodeUnavailable
from miso.sched import Policy


class ClusterView:
    """The controller's views (see the module docstring); ``health`` says what keeps it from
    scheduling (:meth:`miso.controller.controller.Controller.health`), ``owner_names`` is its
    owner id -> user name."""

    def __init__(self, rt: Runtime, store: JobStore, loop: EventLoop, policy: Policy,
                 quotas: QuotaStore, owner_names: dict[str, str],
                 health: Callable[[], list[str]]) -> None:
        self.rt = rt
        self.store = store
        self.loop = loop
        self.policy = policy
        self.quotas = quotas
        self.owner_names = owner_names
        self.health = health

    def status(self, limit: int | None = None) -> dict[str, Any]:
        """GPUs (layout, phase, jobs) and jobs (state, slice, speed, progress, and ``why``: one
        line on why it waits, or its full failure reason); ``limit``: the latest jobs only
        (a page; the counts are ``store.counts()``)."""
        snap = self.cluster()
        jobs = [r.to_json() for r in self.store.jobs(limit=limit)]
        pinned = {j["id"] for j in jobs if j.get("checkpointable") is False}
        names = {j["id"]: j.get("owner_name") for j in jobs}
        index = SnapIndex(snap, pinned.__contains__)  # one pass over the GPUs for all lines
        for j in jobs:
            j["why"] = why(j, snap, pinned.__contains__, owner_of=names.get,
                           job_name=lambda x: f"job {x}", index=index)
        snap["jobs"] = jobs
        if not snap["nodes"] and any(j["state"] == JobStatus.QUEUED for j in jobs):
            fencing = snap["unreachable"]
            snap["errors"].append(NO_NODES if not fencing else
                                  f"every agent is unreachable ({', '.join(fencing)}): jobs "
                                  f"wait until a node returns")
        return snap

    def cluster(self) -> dict[str, Any]:
        """:meth:`status` without the job records (cheap: no store read)."""
        rt = self.rt
        snap = self.loop.snapshot()
        with rt.lock:
            snap["nodes"] = sorted(rt.nodes)
            snap["unreachable"] = sorted(rt.fencing)
            snap["lost_nodes"] = [lost_node(n, d, n in rt.fencing)
                                  for n, d in sorted(rt.lost.items())]
        snap["time"] = rt.now()
        snap["policy"] = getattr(self.policy, "name", rt.cfg.policy)
        if "owners" in snap:  # tenancy on: usage against entitlement per owner id
            ten = rt.cfg.tenancy
            snap["owners"] = owner_table(snap["owners"], self.quotas.list(), self.owner_names,
                                         ten.default_weight if ten is not None else 1.0)
            # a quota's wait reason names the owner by its user name, not its id
            snap["held"] = {j: owner_named(t, self.owner_names)
                            for j, t in (snap.get("held") or {}).items()}
            snap["fair_wait"] = fair_named(snap.get("fair_wait") or {}, self.owner_names)
        snap["errors"] = self.health() + [n["text"] for n in snap["lost_nodes"]] + \
            list(rt.errors[-20:]) + [
            f"job {b}: its record in the store is malformed; ignored (fix or delete the row "
            f"in {self.store.path})" for b in self.store.bad_rows]
        return snap

    def logs(self, job: str, tail: int = 200) -> str:
        """Output of every attempt of ``job``, fetched from the nodes that ran it."""
        rec = self.store.get(job)
        out = []
        for node in sorted({a["node"] for a in self.store.attempts(rec.id)}):
            try:
                out.append(self.rt.transport.call(node, "logs", rec.id, tail,
                                                  timeout=self.rt.cfg.call_timeout))
            except NodeUnavailable:
                out.append(f"--- {rec.id}: node {node} unreachable ---")
        if rec.reason:
            out.append(f"--- {rec.id} {rec.state}: {rec.reason}")
        return "\n".join(x for x in out if x)
