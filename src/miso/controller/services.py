"""Inference services live: replicas as jobs, the router, replacement and resizing.

A service (``miso serve``) is a set of replicas. Each replica is a job of the service's owner
(``python -m miso.serving.runreplica --port P -- COMMAND``), so the agents launch it through the
guard as the owner's Unix account on one MIG slice with its log capped, like any job; the
replica tells miso it cannot checkpoint, so it is never moved once it runs.

Every ``poll_s`` :meth:`ServiceManager.tick`:

* a replica whose job runs and whose ``GET /ready`` answers 200 joins the router;
* a replica that never gets ready (``ready_timeout_s`` after its job started), whose job ended
  (crashed, killed), or that stops answering ``/ready`` (``misses`` probes in a row) is taken
  out of the router and cancelled, and another is started; the reason is kept
  (``miso services`` shows the last);
* resizing is make-before-break: a new replica is started, and only when it is ready does an
  extra replica drain (no new requests; in-flight ones finish) and stop.

How many replicas: the scheduling core's service planner, fed the router's rate and the
replicas' readiness (:class:`~miso.sim.plannedscale.PlannedScaler`); its
``StartReplica`` / ``DrainReplica`` decisions are carried out here. One replica's capacity is
that of the slice replicas get (the catalogue's, or an emulated server's slowed-down model,
:mod:`miso.serving.emulated`); a capacity measured live (the per-replica rate at which the SLO
was missed) replaces it for that service and is kept in the store.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from miso.controller.replicasize import capacity_rps, expected_slowdown, replica_memory_gb
from miso.controller.servicestore import ServiceRecord, ServiceStore
from miso.jobstatus import JobStatus
from miso.sched.services import DrainReplica, ServiceSpec, StartReplica
from miso.serving import catalog, emulated
from miso.serving.router import Router, RouterServer
from miso.serving.routerproc import RouterProcess
from miso.sim.plannedscale import PlannedScaler

log = logging.getLogger(__name__)

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
JOB_ID = re.compile(r"\bj\d{4,}\b")
ROUTER_FILE = "router.json"
ENDED = {JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELLED}
MAX_BACKOFF_S = 60.0


class ServiceError(Exception):
    """A request about services that cannot be done (one line, for the API's 4xx)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ReplicaState:
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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServiceManager:
    """The services of one controller (see the module docstring)."""

    def __init__(self, controller: Any, store_path: str | Path,
                 router: RouterServer | RouterProcess, *,
                 replica_host: str = "127.0.0.1", python: str = sys.executable,
                 ready_timeout_s: float = 120.0, misses: int = 3,
                 probe_timeout_s: float = 1.0, scaler: PlannedScaler | None = None,
                 slow_factor: float = 10.0, log: Any = None) -> None:
        self.ctl = controller
        self.store = ServiceStore(store_path)
        self.server = router
        self.router: Any = router.router  # a Router, or a RouterProcess with its methods
        self.replica_host = replica_host
        self.python = python
        self.ready_timeout_s = ready_timeout_s
        self.misses = misses
        self.slow_factor = slow_factor
        #: the decision log (``miso events``): every service event goes there too
        self.log = log
        self.probe_timeout_s = probe_timeout_s
        self.scaler = scaler or PlannedScaler()
        #: planner replica ids waiting for a job (a start, or the replacement of a failed one)
        self.pending: dict[str, list[tuple[str, str]]] = {}
        self.lm: Any = catalog
        self.services: dict[str, ServiceRecord] = {}
        self.replicas: dict[str, dict[str, ReplicaState]] = {}
        self.events: dict[str, collections.deque[dict[str, Any]]] = {}
        self.lock = threading.RLock()
        self._seq = int(time.time()) % 100000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._http = httpx.Client(timeout=probe_timeout_s)
        self._models: dict[str, str] = {}
        #: replicas of a service that failed in a row (reset when one gets ready) and when the
        #: next may start: a crash loop backs off up to ``MAX_BACKOFF_S``
        self.failures: dict[str, int] = {}
        self.next_start: dict[str, float] = {}
        for rec in self.store.all():
            if rec.state == "running":
                self._open(rec)
                self._adopt(rec.name)
                self._plan_submit(rec)

    # ---- requests (API side) --------------------------------------------------------------
    def serve(self, rec: ServiceRecord) -> dict[str, Any]:
        if not NAME.match(rec.name):
            raise ServiceError(f"bad service name {rec.name!r}: lower-case letters, digits and "
                               f"'-', at most 63")
        if not rec.command:
            raise ServiceError("no replica command given (miso serve NAME ... -- COMMAND)")
        try:
            self.lm.service_time_s(rec.model, "A100-40GB", "7g.40gb", 1)
        except KeyError as e:
            raise ServiceError(str(e.args[0]) if e.args else f"unknown model {rec.model!r}") \
                from None
        if not (0 < rec.slo_p99_ms <= 600_000):
            raise ServiceError("--slo-p99-ms must be a positive number of ms")
        if not (1 <= rec.min_replicas <= rec.max_replicas <= 64):
            raise ServiceError("need 1 <= --min-replicas <= --max-replicas <= 64")
        with self.lock:
            old = self.services.get(rec.name)
            if old is not None and old.state == "running":
                raise ServiceError(f"service {rec.name!r} exists; stop it first", 409)
            self.store.add(rec)
            rec.state = "running"
            self._open(rec)
            self._note(rec.name, f"started: {rec.min_replicas} replica(s) of {rec.model}")
            self._plan_submit(rec)
        return self.view(rec.name)

    def stop(self, name: str) -> dict[str, Any]:
        with self.lock:
            rec = self.services.get(name)
            if rec is None or rec.state != "running":
                raise ServiceError(f"no running service {name!r}", 404)
            rec.state = "stopped"
            self.scaler.stop(time.monotonic(), name)
            self.pending.pop(name, None)
            self.store.stop(name)
            self.router.stop_service(name)
            for r in self.replicas.get(name, {}).values():
                r.state, r.since = "draining", time.monotonic()
            self._note(name, "stopped: draining every replica")
        return self.view(name)

    def get(self, name: str) -> ServiceRecord | None:
        return self.services.get(name)

    # ---- the loop ---------------------------------------------------------------------------
    def start(self, poll_s: float = 1.0) -> None:
        def run() -> None:
            while not self._stop.wait(poll_s):
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - the manager must outlive one bad tick
                    log.exception("service manager tick failed")

        self._thread = threading.Thread(target=run, name="miso-services", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._http.close()
        self.store.close()

    def tick(self) -> None:
        now = time.monotonic()
        self.keep_router()
        with contextlib.suppress(Exception):  # else the last known GPU models
            self._models = {str(g["id"]): str(g["model"]) for g in self.ctl.cluster()["gpus"]}
        with self.lock:
            names = list(self.services)
        for name in names:
            with self.lock:
                rec = self.services[name]
                reps = dict(self.replicas.get(name, {}))
            for r in reps.values():
                self._check(rec, r, now)
            if rec.state == "running":
                self._scale(rec, now)

    def keep_router(self) -> bool:
        """A router process that died (killed, crashed) is started again on its port (the
        URLs stay) and given the table again: every service, its ready replicas, the
        draining ones drained; stopped services answer 503 again. True when it restarted.
        (The router's rate and latency windows start empty: the planner sees rate 0 for
        one tick, and the scale-in delay keeps it from draining on that.)"""
        alive = getattr(self.server, "alive", None)
        if alive is None or alive():
            return False
        code = self.server.exit_status()
        try:
            self.server.restart()
        except OSError as e:
            log.error("router restart failed: %s", e)
            return False
        with self.lock:
            for name, rec in self.services.items():
                self.router.add_service(name, rec.slo_p99_ms)
                if rec.state != "running":
                    self.router.stop_service(name)
                for r in self.replicas.get(name, {}).values():
                    if r.state in ("ready", "draining"):
                        self.router.add_replica(name, r.job, self.replica_host, r.port,
                                                r.profile)
                    if r.state == "draining":
                        self.router.drain(name, r.job)
                self._note(name, f"router process ended (exit status {code}); restarted on "
                                 f"port {self.server.port} with this service's replicas")
        return True

    # ---- one replica ------------------------------------------------------------------------
    def _check(self, rec: ServiceRecord, r: ReplicaState, now: float) -> None:
        job = self._job(r.job)
        state = job.state if job is not None else JobStatus.CANCELLED
        if r.state == "draining":
            idle = self.router.outstanding(rec.name, r.job) == 0
            if idle or now - r.since > 120 or state in ENDED:
                self._retire(rec.name, r, None)
            return
        if state in ENDED:
            self._retire(rec.name, r, f"replica {r.job} ended ({state}"
                         f"{': ' + job.reason if job is not None and job.reason else ''}); "
                         f"replacing it")
            return
        if state != JobStatus.RUNNING:
            if r.state == "ready":  # moved or checkpointed under us: out of the router
                self.router.remove_replica(rec.name, r.job)
                r.state, r.since, r.running_since = "starting", now, None
            return
        if r.running_since is None:
            r.running_since = now
        r.gpu = job.gpu or ""
        r.gpu_model = self._models.get(r.gpu, r.gpu_model)
        r.profile = (job.placement or "").split("@")[0]
        ok = self._probe(r)
        if r.state == "starting":
            if ok:
                r.state, r.since, r.misses = "ready", now, 0
                self.failures[rec.name] = 0
                self.router.add_replica(rec.name, r.job, self.replica_host, r.port, r.profile)
                self._note(rec.name, f"replica {r.job} ready on {r.profile or '?'} "
                                     f"({r.gpu or '?'})")
                if rec.state == "running" and r.plan_id:
                    self._sync_capacity(rec, now)
                    self._apply(rec, self.scaler.ready(now, rec.name, r.plan_id))
            elif now - r.running_since > self.ready_timeout_s:
                self._retire(rec.name, r, f"replica {r.job} never got ready in "
                                          f"{self.ready_timeout_s:g} s; replacing it")
            return
        r.misses = 0 if ok else r.misses + 1
        if r.misses >= self.misses:
            self._retire(rec.name, r, f"replica {r.job} stopped answering ({r.misses} "
                                      f"probes); replacing it")
            return
        slow = self._slow(rec, r)
        if slow:
            self._retire(rec.name, r, slow)

    def _slow(self, rec: ServiceRecord, r: ReplicaState) -> str | None:
        """Why a ready replica is too slow to keep: its answers (average of the recent ones,
        after 20) over the SLO and over ``slow_factor`` x its model's batch-1 service time on
        its slice, and 5x its ready peers' when they have answered (a loaded service slows
        every replica), with another replica to take its load; else None."""
        mine = next((x for x in self.router.replicas(rec.name) if x["id"] == r.job), None)
        others = [x for x in self.replicas.get(rec.name, {}).values()
                  if x.state != "draining" and x.job != r.job]
        if mine is None or mine["served"] < 20 or not others:
            return None
        ms = float(mine["latency_ewma_ms"])
        try:
            base = 1000.0 * emulated.service_time_s(rec.model, r.gpu_model,
                                                    r.profile or "7g.40gb", 1, r.slowdown)
        except (KeyError, ValueError):
            return None
        peers = [float(x["latency_ewma_ms"]) for x in self.router.replicas(rec.name)
                 if x["id"] != r.job and x["served"] >= 20 and not x["draining"]]
        # without peers that answered, a slow replica may just be an overloaded one
        if not peers or ms <= 5 * min(peers):  # the whole service is loaded, not this one
            return None
        if ms > rec.slo_p99_ms and ms > self.slow_factor * base:
            return (f"replica {r.job} answers in {ms:.0f} ms, {ms / base:.0f}x its model's "
                    f"{base:.1f} ms on {r.profile or '?'}; replacing it")
        return None

    def _job(self, job: str) -> Any:
        try:
            return self.ctl.store.get(job)
        except Exception:  # noqa: BLE001 - a job the store does not have: gone
            return None

    def _probe(self, r: ReplicaState) -> bool:
        try:
            resp = self._http.get(f"http://{self.replica_host}:{r.port}/ready")
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

    def _retire(self, name: str, r: ReplicaState, why: str | None) -> None:
        self.router.remove_replica(name, r.job)
        with self.lock:
            self.replicas.get(name, {}).pop(r.job, None)
        job = self._job(r.job)
        if job is not None and job.state not in ENDED:
            try:
                self.ctl.cancel(r.job)
            except Exception as e:  # noqa: BLE001 - reported, the replica is out anyway
                log.warning("cancel of replica %s failed: %s", r.job, e)
        rec = self.services.get(name)
        if rec is not None and rec.state == "running" and r.plan_id:
            if r.state == "draining":  # a planned drain: its slot is free
                self.scaler.drained(time.monotonic(), name, r.plan_id)
            else:  # a fault: the planner's replica gets another job
                self.pending.setdefault(name, []).append((r.plan_id, f"replacing {r.job}"))
        if why:
            n = self.failures[name] = self.failures.get(name, 0) + 1
            if n >= 2:
                wait = min(MAX_BACKOFF_S, 2.0 ** (n - 1))
                self.next_start[name] = time.monotonic() + wait
                why += f" (failure {n} in a row: the next replica starts in {wait:.0f} s)"
            self._note(name, why)
        elif r.state == "draining":
            self._note(name, f"replica {r.job} drained and stopped")

    # ---- how many ---------------------------------------------------------------------------
    def capacity(self, rec: ServiceRecord, profile: str, gpu_model: str = "A100-40GB",
                 slowdown: float = 1.0) -> float:
        """Requests/s one replica on ``profile`` serves within the SLO
        (:func:`~miso.controller.replicasize.capacity_rps`)."""
        return capacity_rps(rec, profile, gpu_model, slowdown)

    def replica_capacity(self, rec: ServiceRecord, r: ReplicaState) -> float:
        return capacity_rps(rec, r.profile, r.gpu_model, r.slowdown)

    expected_slowdown = staticmethod(expected_slowdown)

    def replica_memory_gb(self, rec: ServiceRecord) -> float | None:
        return replica_memory_gb(rec, next(iter(self._models.values()), "A100-40GB"))

    def _scale(self, rec: ServiceRecord, now: float) -> None:
        reps = list(self.replicas.get(rec.name, {}).values())
        ready = [r for r in reps if r.state == "ready"]
        stats = self.router.stats(rec.name, 10.0)
        rate = float(stats.get("rate") or 0.0)
        profile = ready[0].profile if ready else ""
        cap = self._sync_capacity(rec, now)
        p99 = stats.get("p99_ms")
        # the replicas' own answer times (the router's queueing excluded): a miss is theirs only
        # when they answer slowly themselves, not when the router or the client is the limit
        own = [float(x["latency_ewma_ms"]) for x in self.router.replicas(rec.name)
               if not x["draining"] and x["served"] >= 20]
        replicas_slow = bool(own) and min(own) > rec.slo_p99_ms / 2
        if ready and p99 is not None and p99 > rec.slo_p99_ms and rate > 0 and replicas_slow \
                and stats.get("requests", 0) >= 200:
            measured = 0.9 * rate / len(ready)
            if cap * 0.25 <= measured < cap * 0.95:  # missed below the model's, within reason
                rec.capacity_rps, rec.capacity_profile = measured, profile
                self.store.set_capacity(rec.name, measured, profile)
                self._note(rec.name, f"capacity measured: {measured:.0f}/s per replica on "
                                     f"{profile or '?'} (p99 {p99:.0f} ms > SLO at "
                                     f"{rate:.0f}/s)")
                self._sync_capacity(rec, now)
        self._apply(rec, self.scaler.rate(now, rec.name, rate))
        self._start_pending(rec, now)

    def _reference_capacity(self, rec: ServiceRecord) -> float:
        """One replica's capacity on the slice replicas get here: the first ready replica's
        (measured live when the store has it), before any is ready the model's on a 7g
        (an emulated server's: at the slowdown its command asks for)."""
        ready = [r for r in self.replicas.get(rec.name, {}).values() if r.state == "ready"]
        if ready:
            return self.replica_capacity(rec, ready[0])
        return self.capacity(rec, "", slowdown=self.expected_slowdown(rec))

    def _sync_capacity(self, rec: ServiceRecord, now: float) -> float:
        cap = self._reference_capacity(rec)
        if rec.state == "running":
            self._apply(rec, self.scaler.set_capacity(now, rec.name, cap))
        return cap

    def _plan_submit(self, rec: ServiceRecord) -> None:
        spec = ServiceSpec(rec.name, rec.owner or "", rec.model, rec.slo_p99_ms,
                           min_replicas=rec.min_replicas, max_replicas=rec.max_replicas,
                           headroom=rec.headroom, percentile=rec.percentile)
        now = time.monotonic()
        self._apply(rec, self.scaler.submit(now, spec, self._reference_capacity(rec)))
        self._start_pending(rec, now)

    def _apply(self, rec: ServiceRecord, decisions: list[StartReplica | DrainReplica]) -> None:
        """Carry out the planner's decisions: a start waits in ``pending`` for its job (an
        adopted replica without a planner id takes it); a drain stops routing to the replica,
        which stops once its requests are done (one not ready yet stops at once)."""
        reps = self.replicas.setdefault(rec.name, {})
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
                    self.pending.setdefault(rec.name, []).append((d.replica, why))
                continue
            waiting = self.pending.get(rec.name, [])
            if any(pid == d.replica for pid, _ in waiting):
                self.pending[rec.name] = [x for x in waiting if x[0] != d.replica]
                self.scaler.drained(time.monotonic(), rec.name, d.replica)
                continue
            r = next((x for x in reps.values() if x.plan_id == d.replica), None)
            if r is None:
                self.scaler.drained(time.monotonic(), rec.name, d.replica)
                continue
            r.state, r.since = "draining", time.monotonic()
            self.router.drain(rec.name, r.job)
            self._note(rec.name, f"scale in: draining {r.job} ({why})")

    def _start_pending(self, rec: ServiceRecord, now: float) -> None:
        waiting = self.pending.get(rec.name)
        if not waiting or now < self.next_start.get(rec.name, 0.0):
            return
        self.pending[rec.name] = []
        for pid, why in waiting:
            self._start_replica(rec, why or "start", pid)

    def _start_replica(self, rec: ServiceRecord, why: str, plan_id: str = "") -> None:
        port = free_port(self.replica_host)
        self._seq += 1
        cmd = [self.python, "-m", "miso.serving.runreplica", "--port", str(port), "--",
               *rec.command]
        jid = self.ctl.submit(cmd, name=f"svc-{rec.name}-{self._seq}",
                              memory_gb=self.replica_memory_gb(rec),
                              env=dict(rec.env), cwd=rec.cwd, owner=rec.owner,
                              unix_user=rec.unix_user,
                              owner_name=rec.owner_name)
        with self.lock:
            self.replicas.setdefault(rec.name, {})[jid] = ReplicaState(
                jid, port, since=time.monotonic(), plan_id=plan_id)
        self._note(rec.name, f"{why}: started replica {jid}")

    # ---- bookkeeping --------------------------------------------------------------------------
    def _open(self, rec: ServiceRecord) -> None:
        self.services[rec.name] = rec
        self.replicas.setdefault(rec.name, {})
        self.events.setdefault(rec.name, collections.deque(maxlen=50))
        self.router.add_service(rec.name, rec.slo_p99_ms)

    def _adopt(self, name: str) -> None:
        """Replicas of a service still running from before a controller restart."""
        prefix = f"svc-{name}-"
        for job in self.ctl.store.jobs(active_only=True):
            cmd = list(job.command)
            if job.name.startswith(prefix) and "miso.serving.runreplica" in cmd and "--port" in cmd:
                port = int(cmd[cmd.index("--port") + 1])
                self.replicas[name][job.id] = ReplicaState(job.id, port, since=time.monotonic())

    def _note(self, name: str, text: str) -> None:
        log.info("service %s: %s", name, text)
        self.events.setdefault(name, collections.deque(maxlen=50)).append(
            {"time": time.time(), "text": text})
        if self.log is not None:  # a user sees it when it names one of their replica jobs
            jobs = sorted(set(JOB_ID.findall(text)) | set(self.replicas.get(name, {})))
            with contextlib.suppress(Exception):
                now = getattr(self.ctl, "now", time.time)  # the controller's clock
                self.log.append({"kind": f"service {name}", "time": float(now()),
                                 "trigger": "service", "service": name, "jobs": jobs,
                                 "note": text})

    def view(self, name: str) -> dict[str, Any]:
        rec = self.services[name]
        reps = list(self.replicas.get(name, {}).values())
        ready = [r for r in reps if r.state == "ready"]
        s10 = self.router.stats(name, 10.0)
        s300 = self.router.stats(name, 300.0)
        profile = ready[0].profile if ready else ""
        evs = list(self.events.get(name, ()))
        return {
            "name": name, "owner": rec.owner_name or rec.owner, "model": rec.model,
            "state": rec.state, "url": self.server.service_url(name),
            "slo_p99_ms": rec.slo_p99_ms, "min_replicas": rec.min_replicas,
            "max_replicas": rec.max_replicas, "ready_replicas": len(ready),
            "replicas": [{"job": r.job, "state": r.state, "profile": r.profile, "gpu": r.gpu,
                          "port": r.port,
                          "outstanding": self.router.outstanding(name, r.job)} for r in reps],
            "slices": sorted(r.profile for r in ready),
            "profile": profile or None,
            "capacity_rps": round(self.replica_capacity(rec, ready[0]) if ready
                                  else self._reference_capacity(rec), 2),
            "capacity_measured": bool(rec.capacity_rps and rec.capacity_profile == profile),
            "rate": round(float(s10.get("rate") or 0.0), 2),
            "p50_ms": s10.get("p50_ms"), "p99_ms": s10.get("p99_ms"),
            "attainment": s300.get("attainment"), "errors_5m": s300.get("errors", 0),
            "why": evs[-1]["text"] if evs else "", "events": evs[-10:],
        }

    def views(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self.view(n) for n in self.services]


def start_router(state_dir: str | Path, host: str = "127.0.0.1", registry: Any = None, *,
                 separate_process: bool = True) -> RouterServer | RouterProcess:
    """The head's router (in a process of its own unless ``separate_process`` is False) on
    the port it had before a restart when it is free (stable URLs); records ``router.json``."""
    path = Path(state_dir) / ROUTER_FILE
    port = 0
    try:
        port = int(json.loads(path.read_text()).get("port", 0))
    except (OSError, ValueError, AttributeError):
        port = 0
    srv: RouterServer | RouterProcess
    if separate_process:
        try:
            srv = RouterProcess(host, port, registry)
        except OSError:
            srv = RouterProcess(host, 0, registry)
    else:
        router = Router(registry)
        try:
            srv = RouterServer(router, host, port).start()
        except OSError:
            srv = RouterServer(router, host, 0).start()
    path.write_text(json.dumps({"url": srv.url, "port": srv.port}) + "\n")
    return srv


def attach_services(controller: Any, state_dir: str | Path, observer: Any = None,
                    host: str = "127.0.0.1", *, separate_process: bool = True
                    ) -> ServiceManager:
    """The router (its metrics in the controller's registry) and the service manager of a
    controller, started."""
    metrics = getattr(observer, "metrics", None)
    registry = getattr(metrics, "registry", None)
    srv = start_router(state_dir, host, registry, separate_process=separate_process)
    mgr = ServiceManager(controller, controller.store.path, srv,
                         log=getattr(observer, "log", None))
    mgr.start()
    return mgr
