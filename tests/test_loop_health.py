"""The scheduling loop never dies silently (issue 26, item 6): quota weights are bounded at the
API, the fair-share math is safe at any weight, an exception while handling one item is shown in
the status errors and the loop goes on, and a dead or stuck loop makes ``/healthz`` unhealthy
(and is restarted)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import FAST, AcceptingPlans
from waiting import wait_for

from miso.controller import Controller, ControllerConfig
from miso.controller.quotas import QuotaStore
from miso.controller.storefile import open_store
from miso.sched.tenancyconfig import TenancyConfig


def H(token: str) -> dict[str, str]:  # noqa: N802
    return {"Authorization": f"Bearer {token}"}


def _virtual_controller(tenancy: TenancyConfig) -> Controller:
    """A controller over two A100 GPUs on a virtual clock, driven by ``run_once`` (no
    thread, no agent)."""
    from miso.controller.runtime import GpuRef
    from miso.controller.store import JobStore
    from miso.mig import geometry
    from miso.sched import GpuAdded, make_policy
    from miso.sched.clock import VirtualClock

    con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                     ControllerConfig(policy="nopart", tenancy=tenancy, check_commands=False),
                     checkpoint_root="/nonexistent", clock=VirtualClock(),
                     policy=make_policy("nopart"))
    con.loop.executor = AcceptingPlans()  # type: ignore[assignment]
    for i in range(2):
        con.rt.gpus[f"g{i}"] = GpuRef(f"g{i}", "n0", i, "A100-40GB", geometry("A100-40GB"))
        con.loop.handle(("event", GpuAdded(f"g{i}", "A100-40GB")))
    return con


def test_quota_store__weights_outside_1e_3_to_1e3_and_non_numbers_are_refused(
        tmp_path: Path) -> None:
    qs = QuotaStore(tmp_path / "miso.db")
    for bad in (5e-324, 1e-4, 1e6, 1e3 + 1, float("inf"), True, "2"):
        with pytest.raises(ValueError):
            qs.set("u:e", "eve", weight=bad)
    assert qs.get("u:e") is None
    assert qs.set("u:e", "eve", weight=1e-3).weight == 1e-3
    assert qs.set("u:e", "eve", weight=1e3).weight == 1e3


def test_fair_share__weights_5e_324_beside_1e6_still_place_and_report() -> None:
    """Before: ZeroDivisionError in ``Tenancy.factor`` (the share of 5e-324 rounds to 0) in
    the snapshot after every event; the loop thread died. Weights that reach the core other
    than through the API (an operator's config) must not break it either."""
    con = _virtual_controller(TenancyConfig(weights={"u:e": 5e-324, "u:b": 1e6}))

    def drain() -> None:
        while con.loop.run_once():
            pass

    drain()
    a = con.submit(["train"], memory_gb=4.0, owner="u:e", owner_name="eve")
    b = con.submit(["train"], memory_gb=4.0, owner="u:b", owner_name="bob")
    drain()
    st = con.loop.state
    assert st.jobs[a].gpu is not None and st.jobs[b].gpu is not None
    con.rt.clock.advance(60.0)  # type: ignore[attr-defined]
    c = con.submit(["train"], memory_gb=4.0, owner="u:e", owner_name="eve")
    drain()
    snap = con.cluster()
    assert snap["errors"] == []
    assert 0.0 <= snap["owners"]["u:e"]["fair_share"] <= 1.0
    assert c in st.queue


def test_loop__an_exception_on_one_item_is_shown_and_the_loop_goes_on() -> None:
    con = _virtual_controller(TenancyConfig())
    real = con.loop._update_snapshot
    calls = {"n": 0}

    def broken(*, fresh: bool = False) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ZeroDivisionError("float division by zero")
        real(fresh=fresh)

    con.loop._update_snapshot = broken  # type: ignore[method-assign]
    con.loop.start()
    try:
        j = con.submit(["train"], memory_gb=4.0, owner="u:a", owner_name="alice")
        wait_for(lambda: any("ZeroDivisionError" in e for e in con.cluster()["errors"]), 5)
        k = con.submit(["train"], memory_gb=4.0, owner="u:a", owner_name="alice")
        wait_for(lambda: con.loop.state.jobs.get(k) is not None
                 and con.loop.state.jobs[k].gpu is not None, 5)
        assert con.loop.state.jobs[j].gpu is not None
        assert con.health() == []
    finally:
        con.rt.stopping.set()
        con.loop.join(5)


@pytest.fixture
def api() -> Iterator[Any]:
    """A controller with fair share over one emulated GPU, its API; users admin, eve, bob."""
    from fastapi.testclient import TestClient

    from miso.agent import Agent
    from miso.api import UserStore, create_app
    from miso.backend.emulated import EmulatedBackend
    from miso.transport.inprocess import LocalTransport

    d = Path(tempfile.mkdtemp(prefix="miso-health-"))  # under /tmp: jobs' accounts reach it
    unix = "nobody" if os.geteuid() == 0 else None  # as root, users' jobs need an account
    transport = LocalTransport()
    transport.add(Agent("node0", EmulatedBackend(1, node="node0"), d / "agents" / "node0"))
    cfg = ControllerConfig(**FAST, tenancy=TenancyConfig())  # type: ignore[arg-type]
    ctl = Controller(open_store(d), transport, cfg, checkpoint_root=d / "checkpoints")
    ctl.start()
    users = UserStore(d / "users.db")
    tokens = {"admin": users.add("admin", admin=True),
              "eve": users.add("eve", unix_user=unix), "bob": users.add("bob", unix_user=unix)}
    app = create_app(ctl, users, snapshot_ttl=0.0)
    with TestClient(app) as client:
        yield client, tokens, ctl
    ctl.stop(stop_jobs=True)
    ctl.store.close()
    transport.agents()["node0"].shutdown()
    shutil.rmtree(d, ignore_errors=True)


def test_api__hostile_weights_refused_and_a_true_job_still_finishes(api: Any) -> None:
    client, tokens, ctl = api
    admin = H(tokens["admin"])
    for name, w in (("eve", 5e-324), ("bob", 1e6), ("bob", -0.0)):
        r = client.put(f"/api/v1/quotas/{name}", json={"weight": w}, headers=admin)
        assert r.status_code == 422, (w, r.text)
        assert "\n" not in r.json()["error"]
    r = client.post("/api/v1/jobs", json={"command": ["/bin/true"]}, headers=H(tokens["eve"]))
    assert r.status_code in (200, 201), r.text
    job = r.json()["id"]
    wait_for(lambda: ctl.store.get(job).state == "finished", 20)
    assert client.get("/healthz").json() == {"ok": True, "problems": []}


def test_healthz__a_killed_loop_is_unhealthy_reported_and_restarted(api: Any) -> None:
    """The watchdog: the loop thread ends (here: a BaseException out of one item, as a
    thread killed under it); ``/healthz`` answers 503 with why, ``miso status`` errors say it,
    and the controller starts the loop again."""
    client, tokens, ctl = api
    loop = ctl.loop
    real = loop.run_once

    def die(timeout: float = 0.0) -> bool:
        loop.run_once = real  # type: ignore[method-assign]
        raise SystemExit("killed")

    loop.run_once = die  # type: ignore[method-assign]
    wait_for(lambda: not loop.alive(), 5)
    r = client.get("/healthz")
    assert r.status_code == 503 and not r.json()["ok"]
    assert "scheduling loop is not running" in r.json()["problems"][0]
    errs = client.get("/api/v1/status", headers=H(tokens["admin"])).json()["errors"]
    assert any("scheduling loop is not running" in e for e in errs)
    wait_for(lambda: loop.alive(), 5)          # restarted by the watchdog
    assert client.get("/healthz").status_code == 200
    r = client.post("/api/v1/jobs", json={"command": ["/bin/true"]}, headers=H(tokens["bob"]))
    job = r.json()["id"]
    wait_for(lambda: ctl.store.get(job).state == "finished", 20)


def test_healthz__a_stuck_loop_is_unhealthy(api: Any) -> None:
    client, _, ctl = api
    real = ctl.loop.run_once
    gate = {"stuck": True}

    def stuck(timeout: float = 0.0) -> bool:
        while gate["stuck"]:
            time.sleep(0.05)
        return real(timeout)

    ctl.loop.run_once = stuck  # type: ignore[method-assign]
    time.sleep(0.7)
    ctl.loop.beat -= 120.0
    r = client.get("/healthz")
    assert r.status_code == 503 and "stuck" in r.json()["problems"][0]
    gate["stuck"] = False
    ctl.loop.run_once = real  # type: ignore[method-assign]
    wait_for(lambda: client.get("/healthz").status_code == 200, 5)


def test_api__max_time_quota_and_a_job_time_limit_over_it(api: Any) -> None:
    """(Item 5 through the API: ``max_time_s`` on the quota route, ``time_limit_s`` on a
    submission; over the maximum is a one-line 400.)"""
    client, tokens, ctl = api
    admin, eve = H(tokens["admin"]), H(tokens["eve"])
    r = client.put("/api/v1/quotas/eve", json={"max_time_s": 60}, headers=admin)
    assert r.status_code == 200 and r.json()["quota"]["max_time_s"] == 60.0, r.text
    r = client.post("/api/v1/jobs", json={"command": ["/bin/true"], "time_limit_s": 120},
                    headers=eve)
    assert r.status_code == 400 and "above the maximum of 00:01:00" in r.json()["error"]
    r = client.post("/api/v1/jobs", json={"command": ["/bin/true"]}, headers=eve)
    assert ctl.time_limits.jobs()[r.json()["id"]] == 60.0   # the maximum is the default
    r = client.delete("/api/v1/quotas/eve", headers=admin)
    assert r.json()["had_quota"] and ctl.time_limits.max_time(ctl.store.get(
        next(iter(ctl.time_limits.jobs()))).owner) is None
