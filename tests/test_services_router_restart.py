"""The head restarts a dead router (issue 29): a router process SIGKILLed while a service
serves comes back on the same port with the service's ready replicas, draining ones drained
and stopped services refused again; the restart is in the service's events. A replica job
that waits for a slice is said so in its service's events.

The controller is a stand-in that runs each replica job as a plain process (the service
manager only submits, reads and cancels jobs), so the test needs no cluster."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from waiting import wait_for

from miso.controller.services import ServiceManager, start_router
from miso.controller.servicestore import ServiceRecord
from miso.jobstatus import JobStatus


class Jobs:
    """The job store the manager reads: one record per replica job."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.recs: dict[str, SimpleNamespace] = {}

    def get(self, job: str) -> SimpleNamespace:
        return self.recs[job]

    def jobs(self, active_only: bool = False) -> list[SimpleNamespace]:
        return list(self.recs.values())


class ProcessController:
    """Runs each submitted replica as a process on a pretend 7g.40gb slice."""

    def __init__(self, path: Path) -> None:
        self.store = Jobs(path)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: submitted jobs stay queued (no slice free) instead of running
        self.full = False
        #: replica jobs it was asked to make room for
        self.rooms: list[str] = []

    def cluster(self) -> dict[str, Any]:
        return {"gpus": [{"id": "g0", "model": "A100-40GB"}]}

    def submit(self, cmd: list[str], **kw: Any) -> str:
        jid = f"j{1000 + len(self.store.recs)}"
        if self.full:
            self.store.recs[jid] = SimpleNamespace(
                id=jid, name=kw.get("name") or jid, command=cmd, state=JobStatus.QUEUED,
                gpu=None, placement=None, reason=None)
            return jid
        self.procs[jid] = subprocess.Popen(cmd, start_new_session=True)
        self.store.recs[jid] = SimpleNamespace(
            id=jid, name=kw.get("name") or jid, command=cmd, state=JobStatus.RUNNING,
            gpu="g0", placement="7g.40gb@0", reason=None)
        return jid

    def make_room(self, job: str) -> None:
        self.rooms.append(job)

    def cancel(self, job: str) -> dict[str, Any]:
        p = self.procs.get(job)
        if p is not None:
            p.terminate()
            p.wait(10)
        self.store.recs[job].state = JobStatus.CANCELLED
        return {}

    def close(self) -> None:
        for p in self.procs.values():  # the whole process group: a server's children too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[ServiceManager, ProcessController]]:
    ctl = ProcessController(tmp_path / "miso.db")
    srv = start_router(tmp_path)  # a router process of its own, as on the head
    mgr = ServiceManager(ctl, ctl.store.path, srv)
    yield mgr, ctl
    mgr.close()
    srv.stop()
    ctl.close()


def replica_cmd() -> list[str]:
    return [sys.executable, "-m", "miso.emuserve", "--model", "resnet50", "--load-s", "0.1"]


def test_a_killed_router_is_restarted_on_its_port_with_the_replicas(manager) -> None:  # noqa: ANN001
    mgr, _ = manager
    v = mgr.serve(ServiceRecord(name="live", model="resnet50", slo_p99_ms=100,
                                command=replica_cmd(), min_replicas=2, max_replicas=2))
    mgr.serve(ServiceRecord(name="gone", model="resnet50", slo_p99_ms=100,
                            command=replica_cmd(), min_replicas=1, max_replicas=1))
    mgr.stop("gone")

    def ready() -> bool:
        mgr.tick()
        return mgr.view("live")["ready_replicas"] == 2

    wait_for(ready, 60)
    url, port = v["url"], mgr.server.port
    one = next(iter(mgr.replicas["live"].values()))
    mgr.router.drain("live", one.job)  # as a scale-in would
    one.state = "draining"
    with httpx.Client(timeout=10) as h:
        assert h.post(url + "/infer").status_code == 200
        os.kill(mgr.server.proc.pid, signal.SIGKILL)
        mgr.server.proc.wait(10)
        with pytest.raises(httpx.TransportError):
            h.post(url + "/infer")
        assert mgr.keep_router() is True
        assert mgr.server.port == port and mgr.server.restarts == 1
        assert all(h.post(url + "/infer").status_code == 200 for _ in range(5))
        assert h.post(mgr.server.service_url("gone") + "/infer").status_code == 503
    routed = {r["id"]: r["draining"] for r in mgr.router.replicas("live")}
    assert routed == {r.job: r.job == one.job for r in mgr.replicas["live"].values()}
    assert "router process ended (exit status -9); restarted on port" in \
        "\n".join(e["text"] for e in mgr.events["live"])
    assert mgr.keep_router() is False  # alive: nothing to do


def test_a_replica_that_waits_for_a_slice_is_said_so_once(manager) -> None:  # noqa: ANN001
    from miso.controller import replicawatch

    mgr, ctl = manager
    ctl.full = True
    mgr.serve(ServiceRecord(name="wait", model="resnet50", slo_p99_ms=100,
                            command=replica_cmd()))
    (rep,) = mgr.replicas["wait"].values()
    mgr.tick()
    text = "\n".join(e["text"] for e in mgr.events["wait"])
    assert "waits for a slice" not in text  # not yet: queued for less than the threshold
    rep.since -= replicawatch.QUEUED_NOTE_S + 1
    mgr.tick()
    mgr.tick()
    waits = [e["text"] for e in mgr.events["wait"] if "waits for a slice" in e["text"]]
    assert len(waits) == 1 and waits[0].startswith(f"replica {rep.job} still waits"), waits
    assert "checkpointed to make room" in mgr.view("wait")["why"]
    assert ctl.rooms == [rep.job]  # asked once per ROOM_S while it waits
    rep.room_asked -= replicawatch.ROOM_S + 1
    mgr.tick()
    assert ctl.rooms == [rep.job, rep.job]
