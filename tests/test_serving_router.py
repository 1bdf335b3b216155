"""The service router (miso.serving.router), the emulated server and the load generator's
summary: fast, in-process, loopback only."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from miso import loadgen
from miso.emuserve import EmulatedServer
from miso.serving.router import Replica as RouterReplica
from miso.serving.router import Route, RouterServer


class Backend:
    """An :class:`EmulatedServer` on its own event loop thread."""

    def __init__(self, slow: float = 1.0, never_ready: bool = False) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.srv = EmulatedServer("resnet50", "A100-40GB", "1g.5gb", slow=slow, load_s=0.0,
                                      never_ready=never_ready, slowdown=1.0)
            server = self.loop.run_until_complete(
                asyncio.start_server(self.srv.handle, "127.0.0.1", 0))
            self.server = server
            self.port = server.sockets[0].getsockname()[1]
            self.loop.create_task(self.srv.batcher())
            ready.set()
            self.loop.run_forever()
            tasks = asyncio.all_tasks(self.loop)
            for t in tasks:
                t.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(5)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(2)


@pytest.fixture
def router() -> Iterator[RouterServer]:
    rs = RouterServer().start()
    yield rs
    rs.stop()


def test_pick_is_least_outstanding_and_skips_draining() -> None:
    route = Route("s")
    a, b, c = (RouterReplica(x, "127.0.0.1", 1) for x in "abc")
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 0
    c.draining = True
    route.replicas = {"a": a, "b": b, "c": c}
    assert route.pick() is b
    b.outstanding = 5
    assert route.pick() is a
    a.draining = b.draining = True
    assert route.pick() is None


def test_routes_errors_and_metrics(router: RouterServer) -> None:
    be = Backend()
    try:
        router.router.add_service("svc", 100.0)
        router.router.add_replica("svc", "r1", "127.0.0.1", be.port, "1g.5gb")
        with httpx.Client() as c:
            r = c.post(router.service_url("svc") + "/infer?x=1", content=b"{}")
            assert r.status_code == 200 and r.json()["profile"] == "1g.5gb"
            assert c.get(router.url + "/s/nope").status_code == 404
            assert c.get(router.url + "/other").status_code == 404
            router.router.stop_service("svc")
            r = c.get(router.service_url("svc"))
            assert r.status_code == 503 and "stopped" in r.json()["error"]
        with socket.create_connection(("127.0.0.1", router.port)) as s:
            s.sendall(b"POST /s/svc HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 411")
        from prometheus_client import generate_latest
        text = generate_latest(router.router.registry).decode()
        assert 'miso_service_requests_total{code="200",service="svc"} 1.0' in text
        assert "miso_service_request_duration_seconds_bucket" in text
        assert 'miso_service_replicas{profile="1g.5gb",service="svc",state="draining"} 1.0' \
            in text
    finally:
        be.stop()


def test_drain_finishes_in_flight_and_sends_no_new(router: RouterServer) -> None:
    slow, fast = Backend(slow=100.0), Backend()  # 1g batch-1 x 100: ~0.13 s a request
    try:
        router.router.add_service("svc", 1000.0)
        router.router.add_replica("svc", "slow", "127.0.0.1", slow.port)
        url = router.service_url("svc")
        with ThreadPoolExecutor(4) as ex:
            held = ex.submit(httpx.post, url, content=b"{}", timeout=10)
            deadline = time.monotonic() + 5
            while router.router.outstanding("svc", "slow") == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            router.router.add_replica("svc", "fast", "127.0.0.1", fast.port)
            router.router.drain("svc", "slow")
            after = [httpx.post(url, content=b"{}", timeout=10) for _ in range(5)]
            assert held.result().status_code == 200  # the in-flight request finished
        assert all(r.status_code == 200 for r in after)
        served = {r["id"]: r["served"] for r in router.router.replicas("svc")}
        assert served == {"slow": 1, "fast": 5}
        assert router.router.outstanding("svc", "slow") == 0
    finally:
        slow.stop()
        fast.stop()


def test_dead_replica_is_skipped_before_anything_was_sent(router: RouterServer) -> None:
    be = Backend()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    try:
        router.router.add_service("svc")
        router.router.add_replica("svc", "dead", "127.0.0.1", dead)
        router.router.add_replica("svc", "live", "127.0.0.1", be.port)
        for _ in range(4):
            assert httpx.post(router.service_url("svc"), content=b"{}").status_code == 200
        assert router.router.stats("svc")["errors"] == 0
    finally:
        be.stop()


def test_emulated_server_batches_and_readiness() -> None:
    be = Backend()
    nr = Backend(never_ready=True)
    try:
        assert httpx.get(f"http://127.0.0.1:{be.port}/ready").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{nr.port}/ready").status_code == 503
        with ThreadPoolExecutor(8) as ex, httpx.Client(timeout=10) as c:
            rs = list(ex.map(lambda _: c.post(f"http://127.0.0.1:{be.port}/x"), range(16)))
        assert all(r.status_code == 200 for r in rs)
        assert be.srv.served == 16 and be.srv.batches < 16  # some requests shared a batch
    finally:
        be.stop()
        nr.stop()


def test_summary_windows_after_first_scale_out() -> None:
    res = loadgen.LoadResult()
    # 0-20 s fast, 20-30 s slow (p99 over the SLO), 30-40 s fast
    for i in range(400):
        t = i * 0.1
        res.samples.append(loadgen.Sample(t, 0.2 if 20 <= t < 30 else 0.01, 200))
    res.samples.append(loadgen.Sample(25.0, 0.01, 0))  # a connection error (a miss)
    res.dropped = 2
    res.replicas = [(0.0, 1), (10.0, 2), (25.0, 3), (32.0, 2)]
    out = loadgen.summarize(res, slo_ms=100.0)
    assert out["requests"] == 403 and out["errors"] == 3
    assert out["max_replicas"] == 3 and out["scale_outs"] == 2 and out["scale_ins"] == 1
    # windows from t=10: [10,20) ok, [20,30) slow, [30,40) ok
    assert out["windows"] == 3 and out["windows_within_slo"] == pytest.approx(2 / 3, abs=1e-3)


def test_read_azure_trace_and_ramp(tmp_path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,1,1\n2023-11-16 18:17:05.9799600,1,1\n"
                 "2023-11-16 18:17:04.9799600,1,1\n")
    assert loadgen.read_trace(p, rate_x=2.0) == pytest.approx([0.0, 0.5, 1.0])
    arr = list(loadgen.ramp_arrivals([1, 6, 1], 100.0, 20.0, seed=1))
    first = sum(1 for t in arr if t < 2)
    middle = sum(1 for t in arr if 9 <= t < 11)
    assert 100 < first < 300 and middle > 3 * first


def test_router_process_serves_reports_and_refuses_other_calls() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from miso.serving.routerproc import RouterProcess

    be = Backend()
    reg = CollectorRegistry()
    rp = RouterProcess(registry=reg)
    try:
        rp.add_service("svc", 100.0)
        rp.add_replica("svc", "r1", "127.0.0.1", be.port, "1g.5gb")
        with httpx.Client(timeout=10) as c:
            assert c.post(rp.service_url("svc") + "/x").status_code == 200
        assert rp.stats("svc", 10.0)["requests"] == 1
        assert rp.replicas("svc")[0]["served"] == 1 and rp.outstanding("svc", "r1") == 0
        text = generate_latest(reg).decode()
        assert 'miso_service_requests_total{code="200",service="svc"} 1.0' in text
        with pytest.raises(RuntimeError, match="unknown call"):
            rp._call("__init__")  # noqa: SLF001 - what a caller cannot reach through methods
    finally:
        rp.stop()
        be.stop()
    assert rp.proc.returncode == 0


def test_a_client_behind_its_schedule_stops_on_time() -> None:
    """A ramp far beyond what one client can send (here 1M requests/s for 60 s at a closed
    port) ends at ``end_s``, saying how far into its schedule it got, instead of running on
    for as long as the whole schedule takes to send."""
    import asyncio
    import socket
    import time

    from miso import loadgen

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    arrivals = loadgen.ramp_arrivals([1, 1], 1_000_000.0, 60.0)
    t0 = time.monotonic()
    res = asyncio.run(loadgen.run_load(f"http://127.0.0.1:{port}/x", arrivals,
                                       concurrency=64, timeout_s=1.0, end_s=1.0))
    assert time.monotonic() - t0 < 15.0
    assert res.cut_at_s is not None and 0.0 < res.cut_at_s < 60.0
    assert loadgen.summarize(res)["cut_at_s"] == res.cut_at_s
