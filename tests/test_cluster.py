"""miso on Ray: several nodes on one machine with ``ray.cluster_utils.Cluster``; the controller
actor is SIGKILLed (Ray restarts it, it recovers from its store) and a node is removed (its jobs
finish elsewhere). Few and slow by nature: Ray itself takes seconds to start."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import FAST
from helpers import emu as emu_job

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # everything on 127.0.0.1
ray = pytest.importorskip("ray")

from miso import raycluster as rc  # noqa: E402
from miso.backend.emulated import pids_with_env  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]



def emu(wl: str, work_s: float) -> list[str]:
    return emu_job(wl, work_s, "--checkpoint-every", "0.4")


def call(ref_fn: Any, timeout: float = 60.0) -> Any:
    deadline = time.time() + timeout
    while True:
        try:
            return ray.get(ref_fn(), timeout=10)
        except Exception:  # the controller may be restarting
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_ray_cluster__controller_sigkill_and_node_loss(tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {rc.AGENT_RESOURCE: 1}, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1, resources={rc.AGENT_RESOURCE: 1})
    mark = uuid.uuid4().hex
    try:
        ray.init(address=cluster.address, namespace=rc.NAMESPACE, log_to_driver=False)
        nodes = rc.start_agents({"kind": "emulated", "gpus": 1}, str(tmp_path / "agents"),
                                names=["head", "worker"])
        assert nodes == ["head", "worker"]
        h = rc.start_controller(str(tmp_path), FAST)
        ids = []
        for wl in ["resnet_train128", "bert_train2", "gnn_train512", "mobilenet_train128"]:
            res = call(lambda wl=wl: h.submit.remote(emu(wl, 6.0), None, None, None,
                                                     {"MISO_TEST_MARK": mark}))
            assert res["ok"], res
            ids.append(res["id"])
        bad = call(lambda: h.submit.remote(["/no/such/binary"]))
        assert not bad["ok"] and "unknown command" in bad["error"]

        def running_on_worker() -> bool:
            st = call(lambda: h.status.remote())
            return any(j["state"] == "running" and (j["gpu"] or "").startswith(nodes[1])
                       and (j["checkpoint_iteration"] or 0) > 0 for j in st["jobs"])

        deadline = time.time() + 60
        while not running_on_worker():
            assert time.time() < deadline, call(lambda: h.status.remote())
            time.sleep(0.3)
        # 1. SIGKILL the controller actor's process: Ray restarts it, it recovers.
        pid = call(lambda: h.pid.remote())
        os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        assert call(lambda: h.pid.remote(), 90) != pid
        # 2. Remove the worker node: its agent dies, its jobs are requeued on the head.
        time.sleep(1.5)
        cluster.remove_node(worker)
        deadline = time.time() + 150
        while True:
            st = call(lambda: h.status.remote())
            if all(j["state"] in ("finished", "failed", "cancelled") for j in st["jobs"]):
                break
            assert time.time() < deadline, st
            time.sleep(0.5)
        assert [j["state"] for j in st["jobs"]] == ["finished"] * 4, st["jobs"]
        attempts = call(lambda: h.attempts.remote())
        for j in ids:
            mine = [a for a in attempts if a["job"] == j]
            assert sum(a["status"] == "finished" for a in mine) == 1, mine
            saved = None
            for a in mine:
                if a["start_iteration"] is not None and saved is not None:
                    assert a["start_iteration"] >= saved, mine
                if a["checkpoint_iteration"] is not None:
                    saved = a["checkpoint_iteration"]
        assert "crash" not in " ".join(st["errors"])
        rc.stop_actors(stop_jobs=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    deadline = time.time() + 10
    while pids_with_env("MISO_TEST_MARK", mark) and time.time() < deadline:
        time.sleep(0.2)
    assert not pids_with_env("MISO_TEST_MARK", mark)  # no orphaned job processes
