"""``miso status`` at size: the summary (counts only), and the job list paged and filtered in
SQL (``state``, ``owner``, ``limit``, ``offset``); a waiting job's line on a big cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_api import H, StoreController

from miso.api.app import create_app
from miso.api.users import UserStore
from miso.controller import JobStore
from miso.controller.statustext import why


@pytest.fixture
def api(tmp_path: Path) -> Any:
    users = UserStore(tmp_path / "users.db")
    ctl = StoreController(JobStore(tmp_path / "miso.db"))
    tokens = {"admin": users.add("admin", admin=True), "alice": users.add("alice"),
              "bob": users.add("bob")}
    with TestClient(create_app(ctl, users, snapshot_ttl=0.0)) as client:
        yield client, tokens, ctl


def test_status_summary_counts_and_pages_filtered_by_state_and_owner(api: Any) -> None:
    client, tokens, ctl = api
    ids: dict[str, list[str]] = {"alice": [], "bob": []}
    for i in range(12):
        who = "alice" if i % 3 else "bob"
        r = client.post("/api/v1/jobs", json={"command": ["true"]}, headers=H(tokens[who]))
        ids[who].append(r.json()["id"])
    ctl.store.finish(ids["alice"][0], "finished", at=2.0)
    ctl.store.finish(ids["bob"][0], "failed", reason="x", at=2.0)
    s = client.get("/api/v1/status?summary=true", headers=H(tokens["alice"])).json()
    assert s["summary"] and "jobs" not in s and s["gpus"] == 1 and s["nodes"] == 1
    assert s["counts"]["mine"] == {"finished": 1, "queued": 7}
    assert s["counts"]["all"] == {"finished": 1, "failed": 1, "queued": 10}
    assert s["gpu_phases"] == {"mig": 1} and s["queue"] == 9 and "errors" not in s
    adm = H(tokens["admin"])
    page = client.get("/api/v1/status?limit=3", headers=adm).json()["jobs"]
    everyone = ids["alice"] + ids["bob"]
    newest = sorted(everyone)[-3:]
    assert [j["id"] for j in page] == newest
    page2 = client.get("/api/v1/status?limit=3&offset=3", headers=adm).json()["jobs"]
    assert [j["id"] for j in page2] == sorted(everyone)[-6:-3]
    bobs = client.get("/api/v1/status?owner=bob&state=queued", headers=adm).json()["jobs"]
    assert [j["id"] for j in bobs] == ids["bob"][1:]
    # a user lists its own jobs only; another's name is refused, a bad state too
    assert client.get("/api/v1/status?owner=bob", headers=H(tokens["alice"])).status_code \
        == 403
    mine = client.get("/api/v1/status?owner=alice&state=finished",
                      headers=H(tokens["alice"])).json()["jobs"]
    assert [j["id"] for j in mine] == ids["alice"][:1]
    assert client.get("/api/v1/status?state=nope", headers=adm).status_code == 400
    assert client.get("/api/v1/status?owner=nobody", headers=adm).status_code == 404


def test_a_waiting_jobs_line_counts_the_gpus_of_a_big_cluster() -> None:
    gpus = [{"id": f"n{i // 8}/{i % 8}", "phase": "steady" if i % 4 else "reconfiguring",
             "jobs": [f"x{i}"]} for i in range(1024)]
    line = why({"id": "j1", "state": "queued", "memory_gib": 5.0}, {"gpus": gpus})
    assert "1024 GPUs: 256 reconfiguring, 768 steady, 1024 jobs placed" in line
    assert len(line) < 300
    small = why({"id": "j1", "state": "queued", "memory_gib": 5.0}, {"gpus": gpus[:2]})
    assert "n0/0 reconfiguring 1 job, n0/1 steady 1 job" in small


def test_miso_status_summary_first_and_filters(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from helpers import CLIENT_ENV, FAST, run_cli, served_cluster

    from miso.controller import ControllerConfig

    for k in CLIENT_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with served_cluster(ControllerConfig(**FAST), "miso-paging-") as (sd, _):
        op = {"MISO_STATE_DIR": str(sd)}
        ids = [run_cli("submit", "--", "sleep", "30", **op).stdout.strip() for _ in range(3)]
        r = run_cli("status", "--summary", **op)
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith("jobs: ") and "GPUs: 2; nodes: 1" in r.stdout
        assert "Jobs of" not in r.stdout  # counts only
        assert run_cli("status", "--limit", "1", **op).stdout.startswith("jobs: ")
        st = json.loads(run_cli("status", "--json", "--limit", "1", **op).stdout)
        assert [j["id"] for j in st["jobs"]] == ids[-1:]
        st = json.loads(run_cli("status", "--json", "--state", "cancelled", **op).stdout)
        assert st["jobs"] == []
        r = run_cli("status", "--state", "bogus", **op)
        assert r.exit_code != 0 and "unknown state" in r.output
