"""Services on a one-process emulated cluster (LocalCluster): replicas as jobs, readiness,
the router, stop, and the faults of issue 29 (a replica SIGKILLed under load, one that never
gets ready, one 10x slower than its model). The manager's loop is driven by hand."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import FAST, service_cluster
from waiting import wait_for

from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig
from miso.controller.services import ServiceManager, attach_services
from miso.controller.servicestore import ServiceRecord, ServiceStore
from miso.sched.plannedscale import LIVE_CONFIG, PlannedScaler
from miso.serving import emulated


def emuserve(*extra: str) -> list[str]:
    return [sys.executable, "-m", "miso.emuserve", "--model", "resnet50", "--load-s", "0.2",
            *extra]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, ServiceManager]]:
    with service_cluster(tmp_path, gpus_per_node=2) as got:
        yield got


def ticking(mgr: ServiceManager, pred, timeout: float = 30.0):  # noqa: ANN001, ANN201
    def step():  # noqa: ANN202
        mgr.tick()
        return pred()
    return wait_for(step, timeout)


def events(mgr: ServiceManager, name: str) -> str:
    return "\n".join(e["text"] for e in mgr.events[name])


def test_planned_scaler_scales_out_then_in_make_before_break() -> None:
    from miso.sched.services import DrainReplica, ServiceSpec, StartReplica

    s = PlannedScaler()
    spec = ServiceSpec("a", "u", "resnet50", 100.0, min_replicas=1, max_replicas=8)
    (first,) = s.submit(0.0, spec, capacity=10.0)
    assert isinstance(first, StartReplica)
    assert s.ready(1.0, "a", first.replica) == []
    out = s.rate(2.0, "a", 30.0)  # 30/s x 1.2 over 10/s a replica: 4 replicas
    assert all(isinstance(d, StartReplica) for d in out) and s.planned("a") == 4
    for d in out:
        s.ready(3.0, "a", d.replica)
    drains: list = []
    t = 3.0
    while t < 80.0 and not drains:  # the rate falls: scale in after the delay and cooldown
        t += 1.0
        drains = [d for d in s.rate(t, "a", 5.0) if isinstance(d, DrainReplica)]
    assert drains and t >= 2.0 + LIVE_CONFIG.cooldown_s
    assert s.planned("a") < 4
    # a replica measured slower: the planner covers the rate with more of them
    assert any(isinstance(d, StartReplica) for d in s.set_capacity(t + 1, "a", 1.0))


def test_store_keeps_services_and_measured_capacity(tmp_path: Path) -> None:
    st = ServiceStore(tmp_path / "miso.db")
    st.add(ServiceRecord(name="a", model="resnet50", slo_p99_ms=50, command=["x"], owner="u1"))
    st.set_capacity("a", 123.0, "2g.10gb")
    st.close()
    (rec,) = ServiceStore(tmp_path / "miso.db").all()
    assert (rec.name, rec.owner, rec.capacity_rps, rec.capacity_profile, rec.state) == \
        ("a", "u1", 123.0, "2g.10gb", "running")


@pytest.mark.slow  # ~4.5 s on 2 busy cores
def test_serve_replace_a_killed_replica_and_stop(cluster) -> None:  # noqa: ANN001
    c, mgr = cluster
    view = mgr.serve(ServiceRecord(name="svc", model="resnet50", slo_p99_ms=100,
                                   command=emuserve()))
    ticking(mgr, lambda: mgr.view("svc")["ready_replicas"] == 1)
    v = mgr.view("svc")
    (rep,) = v["replicas"]
    assert v["slices"] == [rep["profile"]] and rep["profile"].endswith("gb")
    job = c.controller.store.get(rep["job"])
    assert "miso.serving.runreplica" in job.command  # a job like any other, on its slice
    with httpx.Client(timeout=10) as h:
        assert h.post(view["url"] + "/infer").json()["profile"] == rep["profile"]
        pid = h.get(f"http://127.0.0.1:{rep['port']}/health").json()["pid"]
        # SIGKILL the server under load: only requests it held may fail
        results: list[int] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=10) as lc:
                while not stop.is_set():
                    try:
                        results.append(lc.post(view["url"] + "/infer").status_code)
                    except httpx.HTTPError:
                        results.append(0)
                    time.sleep(0.01)

        t = threading.Thread(target=load)
        t.start()
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        # replaced: its job ended, or it stopped answering the readiness probe first
        ticking(mgr, lambda: f"replica {rep['job']} ended" in events(mgr, "svc")
                or f"replica {rep['job']} stopped answering" in events(mgr, "svc"))
        ticking(mgr, lambda: mgr.view("svc")["ready_replicas"] == 1
                and mgr.view("svc")["replicas"][0]["job"] != rep["job"])
        time.sleep(0.3)
        stop.set()
        t.join()
        assert results[-1] == 200  # served by the replacement
        errors = [s for s in results if s != 200]
        assert len(errors) <= 3, results  # the requests the dead replica held (1 at a time)
        mgr.stop("svc")
        r = h.post(view["url"] + "/infer")
        assert r.status_code == 503 and "stopped" in r.json()["error"]
    ticking(mgr, lambda: not mgr.view("svc")["replicas"])


def test_never_ready_replica_is_replaced_with_a_reason(cluster) -> None:  # noqa: ANN001
    _, mgr = cluster
    mgr.ready_timeout_s = 1.0
    mgr.serve(ServiceRecord(name="nr", model="resnet50", slo_p99_ms=100,
                            command=emuserve("--never-ready")))
    ticking(mgr, lambda: "never got ready" in events(mgr, "nr"))
    assert "never got ready" in mgr.view("nr")["why"] or \
        "started replica" in mgr.view("nr")["why"]
    ticking(mgr, lambda: len(mgr.view("nr")["replicas"]) == 1)  # a replacement runs


def test_a_ten_times_slower_replica_is_replaced(cluster) -> None:  # noqa: ANN001
    _, mgr = cluster
    mgr.serve(ServiceRecord(name="sl", model="resnet50", slo_p99_ms=5, min_replicas=2,
                            max_replicas=2, command=emuserve()))
    ticking(mgr, lambda: mgr.view("sl")["ready_replicas"] == 2)
    slow_rep = mgr.view("sl")["replicas"][0]
    slow_job = slow_rep["job"]
    # the model's batch-1 time of the emulated server (slowed down) on that replica's slice
    base = emulated.service_time_s("resnet50", "A100-40GB", slow_rep["profile"], 1)
    # the slowness is the router's measurement: feed it one replica's answers at 12 x
    for r in mgr.router.routes["sl"].replicas.values():
        r.served = 50
        r.latency_ewma_s = 12 * base if r.id == slow_job else base
    mgr.tick()
    assert f"replica {slow_job} answers in {12000 * base:.0f} ms, 12x" in events(mgr, "sl")
    assert slow_job not in {r["job"] for r in mgr.view("sl")["replicas"]}


@pytest.mark.slow  # ~5-10 s each: a lost node is noticed after its lease
@pytest.mark.parametrize("processes_die", [True, False], ids=["node-dies", "agent-killed"])
def test_a_lost_node_takes_its_replica_out_and_the_service_keeps_serving(
        tmp_path: Path, processes_die: bool) -> None:
    """The node dies with its processes, or only its agent is SIGKILLed and the replica it
    started goes on answering: either way the replica leaves the router once the node's lease
    lapses (an orphan is never routed to; its job is requeued, so it comes back once a slice
    is free), and the service answers 200 from the other."""
    cfg = ControllerConfig(**{**FAST, "lease_s": 2.0})
    c = LocalCluster(tmp_path, config=cfg, nodes=2, gpus_per_node=1, rate_window=0.5)
    mgr = attach_services(c.controller, tmp_path)  # the router in its own process
    mgr._stop.set()  # noqa: SLF001 - the test drives tick() itself
    orphan = None
    try:
        v = mgr.serve(ServiceRecord(name="ha", model="resnet50", slo_p99_ms=100,
                                    min_replicas=2, max_replicas=2, command=emuserve()))
        ticking(mgr, lambda: mgr.view("ha")["ready_replicas"] == 2)
        gpus = {r["job"]: r["gpu"] for r in mgr.view("ha")["replicas"]}
        lost_node = sorted(gpus.values())[-1].split("/")[0]
        orphan = c.transport.remove(lost_node, kill_jobs=processes_die)
        lost = {j for j, g in gpus.items() if g.startswith(lost_node + "/")}
        ticking(mgr, lambda: not lost & {r["job"] for r in mgr.view("ha")["replicas"]
                                         if r["state"] == "ready"}, timeout=40)
        routed = {r["id"] for r in mgr.router.replicas("ha")}
        assert not lost & routed
        with httpx.Client(timeout=15) as h:
            codes = [h.post(v["url"] + "/infer").status_code for _ in range(10)]
        assert codes == [200] * 10
    finally:
        if orphan is not None and not processes_die:
            orphan.shutdown()  # the orphaned replica processes
        mgr.close()
        mgr.server.stop()
        assert c.controller is not None
        c.controller.stop(stop_jobs=True)


SLOW_FIRST = """
import os, sys
try:  # the first replica to start is 15x slower than its model, the others are not
    os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL))
    slow = "15"
except FileExistsError:
    slow = "1"
os.execv(sys.executable, [sys.executable, "-m", "miso.emuserve", "--model", "resnet50",
                          "--load-s", "0.2", "--slow", slow])
"""


@pytest.mark.slow  # ~10 s: 60 requests through the router, a third of them 15x slow
def test_a_replica_really_15x_slower_is_measured_and_replaced(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    _, mgr = cluster
    v = mgr.serve(ServiceRecord(name="rs", model="resnet50", slo_p99_ms=100, min_replicas=2,
                                max_replicas=2, command=[sys.executable, "-c", SLOW_FIRST,
                                                         str(tmp_path / "first")]))
    ticking(mgr, lambda: mgr.view("rs")["ready_replicas"] == 2)
    with httpx.Client(timeout=10) as h:
        for _ in range(60):
            assert h.post(v["url"] + "/infer").status_code == 200
    answers = {r["id"]: r["latency_ewma_ms"] for r in mgr.router.replicas("rs")}
    slow_job = max(answers, key=lambda j: answers[j])
    mgr.tick()
    assert f"replica {slow_job} answers in" in events(mgr, "rs"), (answers, events(mgr, "rs"))
    assert slow_job not in {r["job"] for r in mgr.view("rs")["replicas"]}


def test_replica_asks_for_a_slice_that_serves_and_capacity_follows_the_slowdown() -> None:
    from miso.controller.replicasize import capacity_rps, expected_slowdown, replica_memory_gb

    emu = ServiceRecord(name="e", model="resnet50", slo_p99_ms=100,
                        command=["python", "-m", "miso.emuserve", "--model", "resnet50"])
    fast = ServiceRecord(name="f", model="resnet50", slo_p99_ms=100,
                         command=["python", "-m", "miso.emuserve", "--slowdown", "1"])
    assert expected_slowdown(emu) == emulated.DEFAULT_SLOWDOWN
    assert expected_slowdown(fast) == 1.0
    # slowed down 400x a 1g.5gb or 2g.10gb barely serves: the replica asks for more memory
    # than a 2g.10gb has (9.75 GiB), so it gets a 3g/4g.20gb or a 7g
    assert replica_memory_gb(emu) > 9.75 * 1024**3 / 1e9
    assert replica_memory_gb(ServiceRecord(name="m", model="resnet50", slo_p99_ms=100,
                                           command=["x"], memory_gb=7.0)) == 7.0
    slowed = capacity_rps(emu, "3g.20gb", slowdown=expected_slowdown(emu))
    assert 5 < slowed < 30 < capacity_rps(emu, "3g.20gb")  # tens/s vs the catalogue's
