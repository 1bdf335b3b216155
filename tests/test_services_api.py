"""The services API: owners and admins as for jobs; a non-admin sees other owners' services
as counts only; a stopped service's URL answers a clear 503 (through the manager)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_api import StoreController

from miso.api.app import create_app
from miso.api.services import services_router
from miso.api.users import UserStore
from miso.controller import JobStore
from miso.controller.services import ServiceManager
from miso.observe.decisionwords import describe
from miso.observe.eventlog import DecisionLog
from miso.serving.router import RouterServer


def H(token: str) -> dict[str, str]:  # noqa: N802
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def api(tmp_path: Path) -> Any:
    users = UserStore(tmp_path / "users.db")
    ctl = StoreController(JobStore(tmp_path / "miso.db"))
    mgr = ServiceManager(ctl, tmp_path / "miso.db", RouterServer(), log=DecisionLog(None))
    tokens = {"admin": users.add("admin", admin=True, unix_user="daemon"),
              "alice": users.add("alice", unix_user="nobody"), "bob": users.add("bob")}
    app = create_app(ctl, users, extra_routers=[services_router(mgr)], snapshot_ttl=0.0)
    with TestClient(app) as client:
        yield client, tokens, ctl, mgr
    mgr.close()


BODY = {"name": "svc-a", "model": "resnet50", "slo_p99_ms": 50,
        "command": ["python", "-m", "miso.emuserve", "--model", "resnet50"]}


def test_owner_admin_and_counts_only_for_others(api: Any) -> None:
    client, tok, ctl, mgr = api
    assert client.get("/api/v1/services").status_code == 401
    r = client.post("/api/v1/services", json=BODY, headers=H(tok["alice"]))
    assert r.status_code == 201, r.text
    assert r.json()["url"].endswith("/s/svc-a")
    mgr.tick()  # starts its replica: a job of alice, as alice's Unix account
    (job,) = ctl.store.jobs()
    assert (job.owner_name, job.unix_user) == ("alice", "nobody")
    assert "miso.serving.runreplica" in job.command
    assert ctl.ahead == [job.name]  # the head's replica job is queued ahead of others
    r = client.post("/api/v1/jobs", json={"command": ["python", "x.py"], "ahead": True},
                    headers=H(tok["alice"]))
    assert r.status_code == 422 and ctl.ahead == [job.name]  # a user cannot ask for it
    assert client.post("/api/v1/services", json=BODY,
                       headers=H(tok["bob"])).status_code == 409  # the name is taken
    # every resize is in the decision log (miso events) with its reason, naming the replica
    recs = [r for r in mgr.log.recent(50) if r.get("service") == "svc-a"]
    assert any(job.id in r["jobs"] and "start" in describe(r) for r in recs)
    bob = client.get("/api/v1/services", headers=H(tok["bob"])).json()
    assert bob["services"] == [] and bob["others"] == {"services": 1, "replicas": 1}
    assert client.get("/api/v1/services/svc-a", headers=H(tok["bob"])).status_code == 404
    assert client.delete("/api/v1/services/svc-a", headers=H(tok["bob"])).status_code == 404
    adm = client.get("/api/v1/services", headers=H(tok["admin"])).json()
    assert [s["name"] for s in adm["services"]] == ["svc-a"]
    mine = client.get("/api/v1/services", headers=H(tok["alice"])).json()["services"][0]
    assert {"name", "url", "ready_replicas", "rate", "replicas", "slices", "p50_ms", "p99_ms",
            "slo_p99_ms", "attainment", "why"} <= set(mine)
    r = client.delete("/api/v1/services/svc-a", headers=H(tok["admin"]))
    assert r.status_code == 200 and r.json()["state"] == "stopped"
    assert client.get("/api/v1/services", headers=H(tok["alice"])).json()["services"] == []


def test_bad_requests(api: Any) -> None:
    client, tok, _, _ = api
    for bad in ({"name": "Bad Name!"}, {"model": "nope"}, {"slo_p99_ms": -1},
                {"min_replicas": 3, "max_replicas": 2}):
        r = client.post("/api/v1/services", json={**BODY, **bad}, headers=H(tok["alice"]))
        assert r.status_code in (400, 422), (bad, r.text)
