"""Replica supervision of the live services: each replica's job and readiness, checked
every tick of :class:`~miso.controller.services.ServiceManager`.

* a replica whose job runs and whose ``GET /ready`` answers 200 joins the router;
* a replica that never gets ready (``ready_timeout_s`` after its job started), whose job ended
  (crashed, killed), that stops answering ``/ready`` (``misses`` probes in a row) or that
  answers far slower than its model (:meth:`ReplicaWatch.slow`) is taken out of the router
  and cancelled, and the planner's replica gets another job; the reason is kept (``miso
  services`` shows the last), and a crash loop backs off up to :data:`MAX_BACKOFF_S`;
* a replica whose job stops running (moved, checkpointed, its node lost) leaves the router
  until it runs again;
* a draining replica stops once its in-flight requests are done.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx

from miso.controller.servicestore import ServiceRecord
from miso.jobstatus import JobStatus
from miso.serving import emulated

log = logging.getLogger(__name__)

ENDED = {JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELLED}
MAX_BACKOFF_S = 60.0
#: a replica job queued this long is said to wait for a slice (once) in its service's events
QUEUED_NOTE_S = 10.0
#: a replica job queued this long asks the controller to checkpoint a training job to make
#: room for it (:meth:`~miso.controller.controller.Controller.make_room`), again this often
ROOM_S = 5.0


@dataclass
class ReplicaState:
    """One replica job of a live service as the manager follows it."""

    job: str
    port: int
    state: str = "starting"  # starting | ready | draining
    since: float = 0.0  # monotonic: when it entered this state
    running_since: float | None = None
    profile: str = ""
    gpu: str = ""
    gpu_model: str = "A100-40GB"
    misses: int = 0
    #: an emulated server's throughput divisor, from its ``/ready`` answer (1: a real server;
    #: :mod:`miso.serving.emulated`)
    slowdown: float = 1.0
    #: the planner's id of the replica this job is (a replacement keeps its predecessor's)
    plan_id: str = ""
    #: its wait for a slice is in the service's events
    wait_noted: bool = False
    #: when it last asked for room (a training job checkpointed for it), 0: never
    room_asked: float = 0.0


class ReplicaWatch:
    """The replica checks of one :class:`~miso.controller.services.ServiceManager` ``m``
    (its tables, router and controller are the manager's)."""

    def __init__(self, manager: Any) -> None:
        self.m = manager

    def wait_for_slice(self, rec: ServiceRecord, r: ReplicaState, now: float) -> None:
        """A replica job still queued: after :data:`ROOM_S` (and again each :data:`ROOM_S`)
        the controller checkpoints a training job to make room when one does (the replica is
        queued ahead of it, so the policy places the replica there); after
        :data:`QUEUED_NOTE_S` its wait is in the service's events (once)."""
        waited = now - r.since
        if waited >= ROOM_S and now - r.room_asked >= ROOM_S:
            r.room_asked = now
            self.m.ctl.make_room(r.job)
        if not r.wait_noted and waited >= QUEUED_NOTE_S:
            r.wait_noted = True
            self.m.note(rec.name, f"replica {r.job} still waits for a slice after "
                                  f"{waited:.0f} s (a training job is checkpointed to make "
                                  f"room when one can)")

    def check(self, rec: ServiceRecord, r: ReplicaState, now: float) -> None:
        job = self.job(r.job)
        state = job.state if job is not None else JobStatus.CANCELLED
        if r.state == "draining":
            idle = self.m.router.outstanding(rec.name, r.job) == 0
            if idle or now - r.since > 120 or state in ENDED:
                self.retire(rec.name, r, None)
            return
        if state in ENDED:
            self.retire(rec.name, r, f"replica {r.job} ended ({state}"
                         f"{': ' + job.reason if job is not None and job.reason else ''}); "
                         f"replacing it")
            return
        if state != JobStatus.RUNNING:
            if r.state == "ready":  # moved or checkpointed under us: out of the router
                self.m.router.remove_replica(rec.name, r.job)
                r.state, r.since, r.running_since = "starting", now, None
            elif state == JobStatus.QUEUED:
                self.wait_for_slice(rec, r, now)
            return
        if r.running_since is None:
            r.running_since = now
        r.gpu = job.gpu or ""
        r.gpu_model = self.m.models.get(r.gpu, r.gpu_model)
        r.profile = (job.placement or "").split("@")[0]
        ok = self.probe(r)
        if r.state == "starting":
            if ok:
                r.state, r.since, r.misses = "ready", now, 0
                self.m.failures[rec.name] = 0
                self.m.router.add_replica(rec.name, r.job, self.m.replica_host, r.port, r.profile)
                self.m.note(rec.name, f"replica {r.job} ready on {r.profile or '?'} "
                                      f"({r.gpu or '?'})")
                if rec.state == "running" and r.plan_id:
                    self.m.scaling.sync_capacity(rec, now)
                    self.m.scaling.apply(rec, self.m.scaler.ready(now, rec.name, r.plan_id))
            elif now - r.running_since > self.m.ready_timeout_s:
                self.retire(rec.name, r, f"replica {r.job} never got ready in "
                                         f"{self.m.ready_timeout_s:g} s; replacing it")
            return
        r.misses = 0 if ok else r.misses + 1
        if r.misses >= self.m.misses:
            self.retire(rec.name, r, f"replica {r.job} stopped answering ({r.misses} "
                                     f"probes); replacing it")
            return
        slow = self.slow(rec, r)
        if slow:
            self.retire(rec.name, r, slow)

    def slow(self, rec: ServiceRecord, r: ReplicaState) -> str | None:
        """Why a ready replica is too slow to keep: its answers (average of the recent ones,
        after 20) over the SLO and over ``slow_factor`` x its model's batch-1 service time on
        its slice, and 5x its ready peers' when they have answered (a loaded service slows
        every replica), with another replica to take its load; else None."""
        mine = next((x for x in self.m.router.replicas(rec.name) if x["id"] == r.job), None)
        others = [x for x in self.m.replicas.get(rec.name, {}).values()
                  if x.state != "draining" and x.job != r.job]
        if mine is None or mine["served"] < 20 or not others:
            return None
        ms = float(mine["latency_ewma_ms"])
        try:
            base = 1000.0 * emulated.service_time_s(rec.model, r.gpu_model,
                                                    r.profile or "7g.40gb", 1, r.slowdown)
        except (KeyError, ValueError):
            return None
        peers = [float(x["latency_ewma_ms"]) for x in self.m.router.replicas(rec.name)
                 if x["id"] != r.job and x["served"] >= 20 and not x["draining"]]
        # without peers that answered, a slow replica may just be an overloaded one
        if not peers or ms <= 5 * min(peers):  # the whole service is loaded, not this one
            return None
        if ms > rec.slo_p99_ms and ms > self.m.slow_factor * base:
            return (f"replica {r.job} answers in {ms:.0f} ms, {ms / base:.0f}x its model's "
                    f"{base:.1f} ms on {r.profile or '?'}; replacing it")
        return None

    def job(self, job: str) -> Any:
        try:
            return self.m.ctl.store.get(job)
        except Exception:  # noqa: BLE001 - a job the store does not have: gone
            return None

    def probe(self, r: ReplicaState) -> bool:
        try:
            resp = self.m.http.get(f"http://{self.m.replica_host}:{r.port}/ready")
        except httpx.HTTPError:
            return False
        if resp.status_code != 200:
            return False
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            # an emulated server says how much slower than the catalogue it runs (bounded:
            # it is the owner's process; it only changes its own service's capacity)
            d = float(resp.json().get("slowdown", 1.0))
            if math.isfinite(d):
                r.slowdown = min(max(1.0, d), emulated.MAX_SLOWDOWN)
        return True

    def retire(self, name: str, r: ReplicaState, why: str | None) -> None:
        self.m.router.remove_replica(name, r.job)
        with self.m.lock:
            self.m.replicas.get(name, {}).pop(r.job, None)
        job = self.job(r.job)
        if job is not None and job.state not in ENDED:
            try:
                self.m.ctl.cancel(r.job)
            except Exception as e:  # noqa: BLE001 - reported, the replica is out anyway
                log.warning("cancel of replica %s failed: %s", r.job, e)
        rec = self.m.services.get(name)
        if rec is not None and rec.state == "running" and r.plan_id:
            if r.state == "draining":  # a planned drain: its slot is free
                self.m.scaler.drained(time.monotonic(), name, r.plan_id)
            else:  # a fault: the planner's replica gets another job
                self.m.pending.setdefault(name, []).append((r.plan_id, f"replacing {r.job}"))
        if why:
            n = self.m.failures[name] = self.m.failures.get(name, 0) + 1
            if n >= 2:
                wait = min(MAX_BACKOFF_S, 2.0 ** (n - 1))
                self.m.next_start[name] = time.monotonic() + wait
                why += f" (failure {n} in a row: the next replica starts in {wait:.0f} s)"
            self.m.note(name, why)
        elif r.state == "draining":
            self.m.note(name, f"replica {r.job} drained and stopped")

