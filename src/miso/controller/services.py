"""Inference services live: the service manager (requests, the loop, the router's table).

A service (``miso serve``) is a set of replicas. Each replica is a job of the service's owner
(``python -m miso.serving.runreplica --port P -- COMMAND``), so the agents launch it through the
guard as the owner's Unix account on one MIG slice with its log capped, like any job; the
replica tells miso it cannot checkpoint, so it is never moved once it runs.

Every ``poll_s`` :meth:`ServiceManager.tick` keeps the router process alive (a dead one is
started again on its port with its table: :meth:`ServiceManager.keep_router`), checks every
replica (:mod:`miso.controller.replicawatch`: readiness, replacement, drains) and scales every
running service (:mod:`miso.controller.servicescale`: the scheduling core's planner fed the
router's rate; make-before-break). This module keeps the services' records, their events
(``miso services``, ``miso events``) and their views.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from miso.controller.replicawatch import ReplicaState, ReplicaWatch
from miso.controller.servicescale import ServiceScaling
from miso.controller.servicestore import ServiceRecord, ServiceStore
from miso.sched.plannedscale import PlannedScaler
from miso.serving import catalog
from miso.serving.router import Router, RouterServer
from miso.serving.routerproc import RouterProcess

log = logging.getLogger(__name__)

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
JOB_ID = re.compile(r"\bj\d{4,}\b")
ROUTER_FILE = "router.json"


class ServiceError(Exception):
    """A request about services that cannot be done (one line, for the API's 4xx)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.http = httpx.Client(timeout=probe_timeout_s)
        self.models: dict[str, str] = {}
        #: replicas of a service that failed in a row (reset when one gets ready) and when the
        #: next may start: a crash loop backs off up to ``MAX_BACKOFF_S``
        self.failures: dict[str, int] = {}
        self.next_start: dict[str, float] = {}
        #: the replica checks and the scaling (:mod:`~miso.controller.replicawatch`,
        #: :mod:`~miso.controller.servicescale`)
        self.watch = ReplicaWatch(self)
        self.scaling = ServiceScaling(self)
        for rec in self.store.all():
            if rec.state == "running":
                self._open(rec)
                self._adopt(rec.name)
                self.scaling.plan_submit(rec)

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
            self.note(rec.name, f"started: {rec.min_replicas} replica(s) of {rec.model}")
            self.scaling.plan_submit(rec)
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
            self.note(name, "stopped: draining every replica")
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
        self.http.close()
        self.store.close()

    def tick(self) -> None:
        now = time.monotonic()
        self.keep_router()
        with contextlib.suppress(Exception):  # else the last known GPU models
            self.models = {str(g["id"]): str(g["model"]) for g in self.ctl.cluster()["gpus"]}
        with self.lock:
            names = list(self.services)
        for name in names:
            with self.lock:
                rec = self.services[name]
                reps = dict(self.replicas.get(name, {}))
            for r in reps.values():
                self.watch.check(rec, r, now)
            if rec.state == "running":
                self.scaling.scale(rec, now)

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
                self.note(name, f"router process ended (exit status {code}); restarted on "
                                f"port {self.server.port} with this service's replicas")
        return True

    # ---- one replica ------------------------------------------------------------------------
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

    def note(self, name: str, text: str) -> None:
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
            "capacity_rps": round(self.scaling.replica_capacity(rec, ready[0]) if ready
                                  else self.scaling.reference_capacity(rec), 2),
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
