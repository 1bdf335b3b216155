"""The service router on the head: one stable URL per service, least outstanding requests.

``http://HOST:PORT/s/NAME/rest?query`` goes to ``/rest?query`` on one ready replica of service
``NAME``: the one with the fewest requests in flight (ties: the replica that served least).
A drained replica gets no new request; its in-flight requests finish
(:meth:`Router.drain`, :meth:`Router.outstanding`). A stopped service answers ``503`` with a
JSON body that says so; an unknown one ``404``.

It is HTTP/1.1 on asyncio streams with keep-alive on both sides (a pool of idle connections
per replica), one thread with its own event loop (:class:`RouterServer`). Why miso has its own
router rather than HAProxy, Envoy or Ray Serve: docs/serving.md.

Per service it measures the request rate and latency (:class:`~miso.serving.window.LatencyWindow`,
the controller's rate signal) and exports ``miso_service_requests_total``,
``miso_service_request_duration_seconds`` and ``miso_service_replicas`` (by profile and state)
into a Prometheus registry. Requests are hostile input: the head, the body and the number of
headers are bounded; ``Transfer-Encoding`` from a client is refused (``411``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from miso.serving.http1 import (
    HOP_BY_HOP,
    MAX_HEAD,
    BadRequest,
    json_response,
    read_http_request,
    read_response,
)
from miso.serving.window import LatencyWindow

log = logging.getLogger(__name__)

PREFIX = "/s/"
#: How long a request waits for a ready replica (a service starting, all replicas draining).
WAIT_READY_S = 10.0
UPSTREAM_TIMEOUT_S = 300.0
IDLE_POOL = 1024  # idle keep-alive connections kept per replica (a burst opens new ones)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                    0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
class UpstreamFailed(Exception):
    """The replica failed; ``sent`` says whether the request may have reached it."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(eq=False)
class Replica:
    """One replica the router sends requests to (its address and what it has in flight)."""

    id: str
    host: str
    port: int
    profile: str = ""
    draining: bool = False
    outstanding: int = 0
    served: int = 0
    failed: int = 0
    latency_ewma_s: float = 0.0  # of its answers (weight 0.1 each)
    refused_until: float = 0.0  # monotonic: it refused a connection; others first till then
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)


@dataclass(eq=False)
class Route:
    """A service as the router sees it."""

    name: str
    slo_ms: float | None = None
    stopped: bool = False
    replicas: dict[str, Replica] = field(default_factory=dict)
    window: LatencyWindow = field(default_factory=LatencyWindow)
    #: the service's labelled metric children, looked up once (not per request)
    counters: dict[int, Any] = field(default_factory=dict)
    histogram: Any = None

    def pick(self, exclude: frozenset[str] | set[str] = frozenset()) -> Replica | None:
        best: Replica | None = None
        now = time.monotonic()
        for r in self.replicas.values():
            if r.draining or r.id in exclude or r.refused_until > now:
                continue
            if best is None or (r.outstanding, r.served) < (best.outstanding, best.served):
                best = r
        return best


@dataclass
class Request:
    method: bytes
    path: bytes  # what the replica gets (the service prefix removed)
    service: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request for a service (its name and the path the replica gets)."""
    raw = await read_http_request(reader)
    if raw is None:
        return None
    if not raw.target.startswith(PREFIX.encode()):
        raise BadRequest(404, f"no service here: URLs are {PREFIX}NAME/...")
    rest = raw.target[len(PREFIX):]
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    name, path = rest[:cut], rest[cut:]
    if not path.startswith(b"/"):
        path = b"/" + path
    return Request(raw.method, path, name.decode("ascii", "replace"), raw.headers, raw.body,
                   raw.keep_alive)


class Router:
    """The services and their replicas; :meth:`serve` is the connection handler.

    Mutators may be called from any thread (plain assignments under the GIL; the event loop
    only reads the table)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.routes: dict[str, Route] = {}
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter("miso_service_requests", "Requests through the service router",
                                ["service", "code"], registry=self.registry)
        self.latency = Histogram("miso_service_request_duration_seconds",
                                 "Latency of a request through the router (replica included)",
                                 ["service"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_ReplicaGauge(self))

    # ---- the table (controller side) -----------------------------------------------------
    def add_service(self, name: str, slo_ms: float | None = None) -> Route:
        route = self.routes.get(name)
        if route is None or route.stopped:
            route = Route(name, slo_ms)
            self.routes[name] = route
        route.slo_ms = slo_ms
        return route

    def stop_service(self, name: str) -> None:
        """Later requests get a clear 503; in-flight ones finish."""
        route = self.routes.get(name)
        if route is not None:
            route.stopped = True
            for r in route.replicas.values():
                r.draining = True

    def forget_service(self, name: str) -> None:
        self.routes.pop(name, None)

    def add_replica(self, service: str, replica_id: str, host: str, port: int,
                    profile: str = "") -> None:
        route = self.routes[service]
        route.replicas[replica_id] = Replica(replica_id, host, port, profile)

    def drain(self, service: str, replica_id: str) -> None:
        r = self.routes[service].replicas.get(replica_id)
        if r is not None:
            r.draining = True

    def outstanding(self, service: str, replica_id: str) -> int:
        route = self.routes.get(service)
        r = route.replicas.get(replica_id) if route else None
        return r.outstanding if r is not None else 0

    def remove_replica(self, service: str, replica_id: str) -> None:
        route = self.routes.get(service)
        r = route.replicas.pop(replica_id, None) if route else None
        if r is not None:
            idle, r.idle = r.idle, []
            for _, w in idle:
                with contextlib.suppress(Exception):
                    w.transport.abort()

    def replicas(self, service: str) -> list[dict[str, Any]]:
        route = self.routes.get(service)
        return [{"id": r.id, "port": r.port, "profile": r.profile, "draining": r.draining,
                 "outstanding": r.outstanding, "served": r.served, "failed": r.failed,
                 "latency_ewma_ms": round(r.latency_ewma_s * 1000, 3)}
                for r in (route.replicas.values() if route else ())]

    def stats(self, service: str, window_s: float = 60.0) -> dict[str, Any]:
        route = self.routes.get(service)
        if route is None:
            return {}
        return route.window.summary(time.monotonic(), window_s, route.slo_ms)

    # ---- the data path --------------------------------------------------------------------
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    req = await read_request(reader)
                except BadRequest as e:
                    writer.write(json_response(e.status, {"error": str(e)}, False))
                    await writer.drain()
                    return
                if req is None:
                    return
                writer.write(await self._forward(req))
                await writer.drain()
                if not req.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _forward(self, req: Request) -> bytes:
        t0 = time.monotonic()
        route = self.routes.get(req.service)
        if route is None:
            return json_response(404, {"error": f"no service {req.service!r}"}, req.keep_alive)
        replica, tried = None, set()
        deadline = t0 + WAIT_READY_S
        while True:
            if route.stopped:
                return json_response(503, {"error": f"service {req.service!r} is stopped",
                                            "service": req.service, "stopped": True},
                                      req.keep_alive)
            replica = route.pick(tried)
            if replica is None:  # none ready, or every one refused: wait for one
                if time.monotonic() > deadline:
                    return self._done(route, t0, 503, json_response(
                        503, {"error": f"service {req.service!r} has no ready replica"},
                        req.keep_alive))
                await asyncio.sleep(0.02)
                tried.clear()
                continue
            replica.outstanding += 1
            try:
                t1 = time.monotonic()
                status, head, body = await self._call(replica, req)
                replica.served += 1
                lat = time.monotonic() - t1
                replica.latency_ewma_s = lat if replica.served == 1 else \
                    0.9 * replica.latency_ewma_s + 0.1 * lat
                break
            except UpstreamFailed as e:
                replica.failed += 1
                tried.add(replica.id)
                if not e.sent:
                    replica.refused_until = time.monotonic() + 1.0
                if e.sent:
                    return self._done(route, t0, 502, json_response(
                        502, {"error": f"replica {replica.id} of {req.service!r} failed: {e}"},
                        req.keep_alive))
            finally:
                replica.outstanding -= 1
        conn = b"Connection: keep-alive\r\n\r\n" if req.keep_alive else b"Connection: close\r\n\r\n"
        return self._done(route, t0, status, head + conn + body)

    def _done(self, route: Route, t0: float, status: int, data: bytes) -> bytes:
        now = time.monotonic()
        lat = now - t0
        route.window.add(now, lat, 200 <= status < 400)
        counter = route.counters.get(status)
        if counter is None:
            counter = route.counters[status] = self.requests.labels(route.name, str(status))
        counter.inc()
        if route.histogram is None:
            route.histogram = self.latency.labels(route.name)
        route.histogram.observe(lat)
        return data

    async def _call(self, r: Replica, req: Request) -> tuple[int, bytes, bytes]:
        head = [req.method + b" " + req.path + b" HTTP/1.1\r\n"]
        head += [k + b": " + v + b"\r\n" for k, v in req.headers
                 if k.lower() not in HOP_BY_HOP]
        head.append(b"Content-Length: " + str(len(req.body)).encode() + b"\r\n\r\n")
        data = b"".join(head) + req.body
        while True:
            pooled = bool(r.idle)
            if pooled:
                reader, writer = r.idle.pop()
                if reader.at_eof() or writer.is_closing():
                    writer.transport.abort()
                    continue
            else:
                try:
                    reader, writer = await asyncio.open_connection(r.host, r.port,
                                                                   limit=MAX_HEAD)
                except OSError as e:
                    raise UpstreamFailed(f"connect: {e}", sent=False) from None
            try:
                writer.write(data)
                async with asyncio.timeout(UPSTREAM_TIMEOUT_S):  # no extra task per request
                    status, out, body, reusable = await read_response(reader)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    TimeoutError, ValueError, IndexError, BadRequest) as e:
                writer.transport.abort()
                if pooled and isinstance(e, asyncio.IncompleteReadError) and not e.partial:
                    continue  # a keep-alive connection the replica had closed: a fresh one
                raise UpstreamFailed(type(e).__name__, sent=True) from None
            if reusable and not r.draining and len(r.idle) < IDLE_POOL:
                r.idle.append((reader, writer))
            else:
                writer.close()
            return status, out, body


class _ReplicaGauge:
    """``miso_service_replicas{service,profile,state}`` read at scrape time."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def describe(self) -> Iterable[Any]:
        return [GaugeMetricFamily("miso_service_replicas", "Replicas of a service",
                                  labels=["service", "profile", "state"])]

    def collect(self) -> Iterable[Any]:
        g = GaugeMetricFamily("miso_service_replicas", "Replicas of a service",
                              labels=["service", "profile", "state"])
        counts: dict[tuple[str, str, str], int] = {}
        for route in list(self.router.routes.values()):
            for r in list(route.replicas.values()):
                key = (route.name, r.profile, "draining" if r.draining else "ready")
                counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            g.add_metric(list(key), n)
        yield g


def raise_fd_limit() -> int:
    """The soft open-files limit raised to the hard one (1,000 client connections need it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return int(soft)


class RouterServer:
    """A :class:`Router` listening on ``host:port`` in its own thread and event loop."""

    def __init__(self, router: Router | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.router = router if router is not None else Router()
        self.host, self.port = host, port
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def service_url(self, name: str) -> str:
        return f"{self.url}{PREFIX}{name}"

    def start(self) -> RouterServer:
        raise_fd_limit()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(
                    self.router.serve, self.host, self.port, limit=MAX_HEAD, backlog=4096))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as e:  # noqa: BLE001 - reported to start()
                failure.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="miso-router", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop, server = self.loop, self._server
        if loop is None or server is None:
            return
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
