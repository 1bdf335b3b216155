"""The issue 33 check on a one-GPU emulated cluster (in-process, no Ray): while the admin's
three jobs share the GPU, every slice with a job in the admin's ``GET /api/v1/cluster`` has a
non-null ``job`` in a non-admin's, and both read the cluster's counts. Slow (~15 s)."""

from __future__ import annotations

import getpass
import time
from pathlib import Path

import httpx
import pytest
from helpers import emu

from miso.api.app import create_app
from miso.api.server import ApiServer, Listen
from miso.api.users import UserStore
from miso.cluster.local import LocalCluster
from miso.controller import Controller, ControllerConfig, JobStore
from miso.observe import attach
from miso.observe.routes import api_routers

pytestmark = pytest.mark.slow


def test_a_non_admin_sees_the_admins_three_jobs_as_busy_slices(tmp_path: Path) -> None:
    # the paper's policy: the three jobs are profiled together, then split the GPU three ways
    cfg = ControllerConfig(policy="miso", estimator="true", poll_interval=0.1,
                           checkpoint_timeout=5.0, profile_seconds_per_level=0.5)
    cluster = LocalCluster(tmp_path / "c", gpus_per_node=1, config=cfg, rate_window=0.5,
                           start=False)
    server = None
    try:
        ctl = Controller(JobStore(tmp_path / "c" / "miso.db"), cluster.transport, cfg,
                         checkpoint_root=tmp_path / "c" / "checkpoints")
        obs = attach(ctl, tmp_path / "c")
        cluster.controller = ctl.start()
        users = UserStore(":memory:")
        admin = users.add("ann", admin=True, unix_user=getpass.getuser(), operator=True)
        bob = users.add("bob")
        server = ApiServer(create_app(ctl, users, extra_routers=api_routers(ctl, obs)),
                           Listen("127.0.0.1", 0))
        url = server.start()

        def view(token: str) -> dict:
            r = httpx.get(url + "/api/v1/cluster", headers={"Authorization": f"Bearer {token}"},
                          timeout=10)
            assert r.status_code == 200, r.text
            return r.json()

        for i, wl in enumerate(("resnet_train128", "bert_train2", "cyclegan_train4")):
            r = httpx.post(url + "/api/v1/jobs", headers={"Authorization": f"Bearer {admin}"},
                           json={"command": emu(wl, 120, ips=20.0), "name": f"a{i}",
                                 "memory_gb": 4}, timeout=10)
            assert r.status_code == 201, r.text
        deadline = time.time() + 90
        while time.time() < deadline:
            full = view(admin)
            busy = [s for g in full["gpus"] for s in g["slices"] if s["job"]]
            if len(busy) == 3:
                break
            time.sleep(0.5)
        assert len(busy) == 3, full["gpus"]
        mine = view(bob)
        full = view(admin)
        for g_full, g_bob in zip(full["gpus"], mine["gpus"], strict=True):
            for a, b in zip(g_full["slices"], g_bob["slices"], strict=True):
                if a["job"] is not None:
                    assert b["job"] is not None, (a, b)
                    assert b["job_name"] == "another user's job"
        assert mine["counts"]["running"] == full["counts"]["running"] >= 3
        assert "a0" not in str(mine["gpus"]) and "ann" not in str(mine["gpus"])
    finally:
        if server is not None:
            server.stop()
        cluster.close()
