"""How many replicas a live service runs and starting them: the scaling half of
:class:`~miso.controller.services.ServiceManager`.

Each tick the router's rate over 10 s goes to the scheduling core's service planner
(:class:`~miso.sched.plannedscale.PlannedScaler`), with one replica's capacity on the slice
replicas get here (the first ready replica's: the catalogue's, an emulated server's slowed
down model, or a capacity measured live, which is kept in the store). Its ``StartReplica`` /
``DrainReplica`` decisions are carried out by :meth:`ServiceScaling.apply`: a start waits in
``pending`` for its job (submitted as a job of the service's owner queued ahead of other
jobs, so the controller's policy places it on a slice; one that waits asks for room:
:meth:`~miso.controller.replicawatch.ReplicaWatch.wait_for_slice`), a drain stops routing
to the replica (it stops once its requests are done). Make-before-break is the planner's:
it drains only once the ready replicas cover the target without the one it drains.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from miso.controller.replicasize import capacity_rps, expected_slowdown, replica_memory_gb
from miso.controller.replicawatch import ReplicaState
from miso.controller.servicestore import ServiceRecord
from miso.sched.services import DrainReplica, ServiceSpec, StartReplica


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServiceScaling:
    """The scaling of one :class:`~miso.controller.services.ServiceManager` ``m`` (its
    tables, router, planner and controller are the manager's)."""

    def __init__(self, manager: Any) -> None:
        self.m = manager
        self.seq = int(time.time()) % 100000

    def capacity(self, rec: ServiceRecord, profile: str, gpu_model: str = "A100-40GB",
                 slowdown: float = 1.0) -> float:
        """Requests/s one replica on ``profile`` serves within the SLO
        (:func:`~miso.controller.replicasize.capacity_rps`)."""
        return capacity_rps(rec, profile, gpu_model, slowdown)

    def replica_capacity(self, rec: ServiceRecord, r: ReplicaState) -> float:
        return capacity_rps(rec, r.profile, r.gpu_model, r.slowdown)

    expected_slowdown = staticmethod(expected_slowdown)

    def replica_memory_gb(self, rec: ServiceRecord) -> float | None:
        return replica_memory_gb(rec, next(iter(self.m.models.values()), "A100-40GB"))

    def scale(self, rec: ServiceRecord, now: float) -> None:
        reps = list(self.m.replicas.get(rec.name, {}).values())
        ready = [r for r in reps if r.state == "ready"]
        stats = self.m.router.stats(rec.name, 10.0)
        rate = float(stats.get("rate") or 0.0)
        profile = ready[0].profile if ready else ""
        cap = self.sync_capacity(rec, now)
        p99 = stats.get("p99_ms")
        # the replicas' own answer times (the router's queueing excluded): a miss is theirs only
        # when they answer slowly themselves, not when the router or the client is the limit
        own = [float(x["latency_ewma_ms"]) for x in self.m.router.replicas(rec.name)
               if not x["draining"] and x["served"] >= 20]
        replicas_slow = bool(own) and min(own) > rec.slo_p99_ms / 2
        if ready and p99 is not None and p99 > rec.slo_p99_ms and rate > 0 and replicas_slow \
                and stats.get("requests", 0) >= 200:
            measured = 0.9 * rate / len(ready)
            if cap * 0.25 <= measured < cap * 0.95:  # missed below the model's, within reason
                rec.capacity_rps, rec.capacity_profile = measured, profile
                self.m.store.set_capacity(rec.name, measured, profile)
                self.m.note(rec.name, f"capacity measured: {measured:.0f}/s per replica on "
                                      f"{profile or '?'} (p99 {p99:.0f} ms > SLO at "
                                      f"{rate:.0f}/s)")
                self.sync_capacity(rec, now)
        self.apply(rec, self.m.scaler.rate(now, rec.name, rate))
        self.start_pending(rec, now)

    def reference_capacity(self, rec: ServiceRecord) -> float:
        """One replica's capacity on the slice replicas get here: the first ready replica's
        (measured live when the store has it), before any is ready the model's on a 7g
        (an emulated server's: at the slowdown its command asks for)."""
        ready = [r for r in self.m.replicas.get(rec.name, {}).values() if r.state == "ready"]
        if ready:
            return self.replica_capacity(rec, ready[0])
        return self.capacity(rec, "", slowdown=self.expected_slowdown(rec))

    def sync_capacity(self, rec: ServiceRecord, now: float) -> float:
        cap = self.reference_capacity(rec)
        if rec.state == "running":
            self.apply(rec, self.m.scaler.set_capacity(now, rec.name, cap))
        return cap

    def plan_submit(self, rec: ServiceRecord) -> None:
        spec = ServiceSpec(rec.name, rec.owner or "", rec.model, rec.slo_p99_ms,
                           min_replicas=rec.min_replicas, max_replicas=rec.max_replicas,
                           headroom=rec.headroom, percentile=rec.percentile)
        now = time.monotonic()
        self.apply(rec, self.m.scaler.submit(now, spec, self.reference_capacity(rec)))
        self.start_pending(rec, now)

    def apply(self, rec: ServiceRecord, decisions: list[StartReplica | DrainReplica]) -> None:
        """Carry out the planner's decisions: a start waits in ``pending`` for its job (an
        adopted replica without a planner id takes it); a drain stops routing to the replica,
        which stops once its requests are done (one not ready yet stops at once)."""
        reps = self.m.replicas.setdefault(rec.name, {})
        for d in decisions:
            w = dict(d.why or {})
            action = str(w.get("action", "plan")).replace("_", " ")
            if float(w.get("covered_rps", 0)) >= float(w.get("target_rps", 0)) and \
                    action == "scale out":
                why = f"start: at least {rec.min_replicas} replica(s)"
            else:
                why = (f"{action}: {w.get('rate_rps', 0):g}/s observed, target "
                       f"{w.get('target_rps', 0):g}/s, covered {w.get('covered_rps', 0):g}/s")
            if isinstance(d, StartReplica):
                orphan = next((r for r in reps.values() if not r.plan_id
                               and r.state != "draining"), None)
                if orphan is not None:
                    orphan.plan_id = d.replica
                else:
                    self.m.pending.setdefault(rec.name, []).append((d.replica, why))
                continue
            waiting = self.m.pending.get(rec.name, [])
            if any(pid == d.replica for pid, _ in waiting):
                self.m.pending[rec.name] = [x for x in waiting if x[0] != d.replica]
                self.m.scaler.drained(time.monotonic(), rec.name, d.replica)
                continue
            r = next((x for x in reps.values() if x.plan_id == d.replica), None)
            if r is None:
                self.m.scaler.drained(time.monotonic(), rec.name, d.replica)
                continue
            r.state, r.since = "draining", time.monotonic()
            self.m.router.drain(rec.name, r.job)
            self.m.note(rec.name, f"scale in: draining {r.job} ({why})")

    def start_pending(self, rec: ServiceRecord, now: float) -> None:
        waiting = self.m.pending.get(rec.name)
        if not waiting or now < self.m.next_start.get(rec.name, 0.0):
            return
        self.m.pending[rec.name] = []
        for pid, why in waiting:
            self.start_replica(rec, why or "start", pid)

    def start_replica(self, rec: ServiceRecord, why: str, plan_id: str = "") -> None:
        port = free_port(self.m.replica_host)
        self.seq += 1
        cmd = [self.m.python, "-m", "miso.serving.runreplica", "--port", str(port), "--",
               *rec.command]
        jid = self.m.ctl.submit(cmd, name=f"svc-{rec.name}-{self.seq}",
                              memory_gb=self.replica_memory_gb(rec),
                              env=dict(rec.env), cwd=rec.cwd, owner=rec.owner,
                              unix_user=rec.unix_user,
                              owner_name=rec.owner_name, ahead=True)
        with self.m.lock:
            self.m.replicas.setdefault(rec.name, {})[jid] = ReplicaState(
                jid, port, since=time.monotonic(), plan_id=plan_id)
        self.m.note(rec.name, f"{why}: started replica {jid}")

