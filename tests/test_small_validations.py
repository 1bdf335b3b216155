"""Issue 26, item 8: a removed user's queued jobs never run later; strict ASCII priorities and
strict quota types; a clean one-line error for a non-ASCII token; `cluster up` after a killed
head says what it waits for."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_api import H, StoreController
from typer.testing import CliRunner

from miso.api import UserStore, create_app
from miso.api.models import QuotaRequest
from miso.cli import app as cli_app
from miso.cli.cluster import wait_for_leftovers
from miso.controller import JobStore
from miso.sched.tenancyconfig import parse_priority


@pytest.fixture
def api(tmp_path: Path) -> Any:
    users = UserStore(tmp_path / "users.db")
    ctl = StoreController(JobStore(tmp_path / "miso.db"))
    tokens = {"admin": users.add("admin", admin=True), "alice": users.add("alice"),
              "bob": users.add("bob")}
    app = create_app(ctl, users, api_url="http://127.0.0.1:1", snapshot_ttl=0.0)
    with TestClient(app) as client:
        yield client, tokens, ctl, users


def test_removing_a_user_cancels_its_queued_jobs(api: Any) -> None:
    client, tokens, ctl, users = api
    ids = [client.post("/api/v1/jobs", json={"command": ["true"]},
                       headers=H(tokens["alice"])).json()["id"] for _ in range(2)]
    r = client.delete("/api/v1/users/alice", headers=H(tokens["admin"]))
    assert r.status_code == 200, r.text
    assert r.json() == {"removed": "alice", "cancelled": ids}
    assert [ctl.store.get(j).state for j in ids] == ["cancelled", "cancelled"]


def test_removing_a_user_with_a_running_job_is_refused(api: Any) -> None:
    client, tokens, ctl, users = api
    jid = client.post("/api/v1/jobs", json={"command": ["true"]},
                      headers=H(tokens["bob"])).json()["id"]
    ctl.store.update(jid, state="running")
    r = client.delete("/api/v1/users/bob", headers=H(tokens["admin"]))
    assert r.status_code == 409 and "running jobs" in r.json()["error"], r.text
    assert users.get("bob").name == "bob"  # still there


@pytest.mark.parametrize("bad", ["１", "1_0", "٣", "+-1", "1 0", "0x10", "1e3"])
def test_priorities_are_ascii_integers_or_classes(bad: str) -> None:
    with pytest.raises(ValueError, match="expected"):
        parse_priority(bad)
    assert parse_priority("-5") == -5 and parse_priority(" HIGH ") == parse_priority("high")


@pytest.mark.parametrize("body", ['{"weight": -0.0}', '{"max_in_use": -0.0}',
                                  '{"weight": "2"}', '{"max_in_use": true}',
                                  '{"max_queued": "2"}', '{"max_queued": true}'])
def test_quota_numbers_are_strict(body: str) -> None:
    with pytest.raises(ValueError):
        QuotaRequest.model_validate(json.loads(body))
    assert QuotaRequest.model_validate({"weight": 2, "max_in_use": 0.5}).weight == 2


def test_a_non_ascii_token_is_a_one_line_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli_app, ["status", "--url", "http://127.0.0.1:9",
                                     "--token", "tök€n"], env={"MISO_CONFIG": str(tmp_path)})
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: the token holds characters other than printable ASCII")
    assert "UnicodeEncodeError" not in r.output and r.output.count("\n") == 1


def test_cluster_up_after_a_killed_head_says_what_it_waits_for(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    sd.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (sd / "cluster.json").write_text(json.dumps({"pid": dead.pid, "state_dir": str(sd)}))
    # the killed head's controller still holds controller.lock for a moment
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(sd / 'controller.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, str(os.getpid()).encode(), 0)\n"
        "print('held', flush=True); time.sleep(1.0)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        said: list[str] = []
        t0 = time.monotonic()
        assert wait_for_leftovers(str(sd), 10, said.append)
        assert time.monotonic() - t0 < 5
        assert len(said) == 1 and f"its controller (PID {holder.pid})" in said[0]
        assert "waiting up to 10s" in said[0]
    finally:
        holder.kill()
        holder.wait()
    fd = os.open(sd / "controller.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held by us now: a holder that never exits
    try:
        assert not wait_for_leftovers(str(sd), 0.5, said.append)
    finally:
        os.close(fd)
