"""The control plane under attack and failure (issue 15, items 3, 6, 7): agents that come back,
users with ids, and the smaller holes (request ids, tokens, /metrics, views, cluster up/down)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

from miso.agent import Agent
from miso.agent.incarnation import Incarnation
from miso.backend import EmulatedBackend
from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig

FAST = dict(profile_seconds_per_level=0.3, profile_warmup_s=0.15, checkpoint_timeout=3.0,
            poll_interval=0.1, lease_s=2.0, poll_timeout=1.0, discover_interval=0.3)


def emu(work_s: float, ips: float = 40.0) -> list[str]:
    return [sys.executable, "-m", "miso.emuworkload", "--workload", "bert_train2",
            "--iterations", str(int(work_s * ips)), "--ips", str(ips),
            "--checkpoint-every", "0.3"]


def supervised(c: LocalCluster) -> Incarnation:
    """A new life of node0's agent (as Ray starts after the agent actor died)."""
    return Incarnation(Agent("node0", EmulatedBackend(2, node="node0"),
                             c.dir / "agents" / "node0", rate_window=0.5))


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "c", nodes=0, config=ControllerConfig(**FAST), start=False,
                     rate_window=0.5)
    c.transport.add(supervised(c))  # type: ignore[arg-type]
    c.start_controller()
    yield c
    c.close()


def _client_module() -> Any:
    """The job commands' module (``miso.cli.client`` once the CLI is a package)."""
    import importlib

    try:
        return importlib.import_module("miso.cli.client")
    except ImportError:
        return importlib.import_module("miso.cli_client")


# ---- 3. agents are supervised ---------------------------------------------------------------


def test_agent_restart__node_is_lost_fenced_and_its_jobs_finish_once(local: LocalCluster) -> None:
    ctl = local.controller
    assert ctl is not None
    ids = [local.submit(emu(2.0), name=f"j{i}") for i in range(3)]
    wait_for(lambda: sum(j["state"] == "running" for j in ctl.status()["jobs"]) >= 2, 60)
    old = local.transport.agents()["node0"]
    # the agent dies (its jobs' guards kill them) and its supervisor starts a new one at once
    local.transport.add(supervised(local))  # type: ignore[arg-type]
    old.shutdown()
    st = wait_for(lambda: (s := ctl.status())["lost_nodes"] and s, 20)
    lost = st["lost_nodes"][0]
    assert lost["node"] == "node0" and lost["since"] > 0 and "restarted" in lost["why"]
    assert any("node0 lost since" in e for e in st["errors"])
    tables = _client_module().render_status({**st, "user": "op"})
    assert [t.title for t in tables][-1] == "LOST nodes"  # `miso status` shows it too
    assert ctl.wait_all(120), ctl.status()
    recs = local.controller.store.jobs()
    assert [r.state for r in recs] == ["finished"] * 3 and {r.id for r in recs} == set(ids)
    # the new agent joined; status still says the node was lost, and since when it is back
    back = ctl.status()["lost_nodes"]
    assert [n["phase"] for n in back] == ["back"] and back[0]["back"] >= back[0]["since"]
    assert "restarted" in back[0]["why"]
    for j in ids:  # one attempt per life of the agent at most: never two at once
        ends = [a for a in ctl.store.attempts(j) if a["status"] == "finished"]
        assert len(ends) <= 1


def test_agent_restart__a_new_life_starts_nothing_until_the_controller_took_it_on(
        tmp_path: Path) -> None:
    from miso.controller import NodeUnavailable

    a = Incarnation(Agent("n", EmulatedBackend(1, node="n"), tmp_path / "n"))
    b = Incarnation(Agent("n", EmulatedBackend(1, node="n"), tmp_path / "n"))
    assert a.report()["incarnation"] != b.report()["incarnation"]
    spec = {"job": "j0001", "attempt": 1, "command": ["true"], "gpu": 0,
            "placement": [0, "7g.40gb"], "mps_pct": None}
    for call in (lambda: a.launch(spec), lambda: a.apply_layout(0, [[0, "7g.40gb"]]),
                 lambda: a.start_mps(0, [0, "7g.40gb"])):
        with pytest.raises(NodeUnavailable, match="restarted"):
            call()  # a launch meant for the agent that died is not run (nor failed)
    assert a.describe()["incarnation"] == a.incarnation
    assert a.apply_layout(0, [[0, "7g.40gb"]])["ok"]
    a.shutdown()
    b.shutdown()


def _copies(mark: str) -> dict[str, int]:
    """Live job processes (not their guards) per job id, from /proc."""
    from miso.backend.emulated import pids_with_env

    out: dict[str, int] = {}
    for pid in pids_with_env("MISO_TEST_MARK", mark):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"guard.py" in argv:
            continue
        jid = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"MISO_JOB_ID=")),
                   "?")
        out[jid] = out.get(jid, 0) + 1
    return out


@pytest.mark.slow
@pytest.mark.ray
def test_cluster_up__a_sigkilled_agent_comes_back_and_every_job_finishes_once(
        tmp_path: Path) -> None:
    import threading
    import time

    from typer.testing import CliRunner

    from miso import raycluster as rc
    from miso.api.client import Client
    from miso.api.credentials import from_state_dir
    from miso.cli import app

    runner = CliRunner()
    sd = str(tmp_path / "state")
    mark = f"agent-kill-{os.getpid()}-{time.time()}"
    r = runner.invoke(app, ["cluster", "up", "--emulated", "--gpus", "2", "--state-dir", sd,
                            "--profile-seconds", "0.3", "--checkpoint-timeout", "3"])
    assert r.exit_code == 0, r.output
    try:
        cred = from_state_dir(sd)
        c = Client(str(cred.url), str(cred.token))
        ids = [c.submit(emu(6.0), name=f"k{i}", env={"MISO_TEST_MARK": mark})
               for i in range(4)]
        wait_for(lambda: len(_copies(mark)) >= 2, 90)
        most: dict[str, int] = {}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                for j, n in _copies(mark).items():
                    most[j] = max(most.get(j, 0), n)
                time.sleep(0.05)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        (pid,) = rc.local_agent_pids(sd)
        os.kill(pid, 9)
        st = wait_for(lambda: (s := c.status())["lost_nodes"] and s, 60)
        assert st["lost_nodes"][0]["node"] == "node0" and st["lost_nodes"][0]["why"]
        r = runner.invoke(app, ["status", "--state-dir", sd])
        assert "LOST nodes" in r.output or not c.status()["lost_nodes"], r.output
        wait_for(lambda: all(j["state"] == "finished" for j in c.status()["jobs"]), 240)
        stop.set()
        t.join(5)
        assert {j["id"] for j in c.status()["jobs"]} == set(ids)
        assert max(most.values()) == 1, most
        assert rc.local_agent_pids(sd) and rc.local_agent_pids(sd) != [pid]
        # back: status still says it was lost, and since when it is back (issue 33)
        assert all(n["phase"] == "back" for n in c.status()["lost_nodes"])
    finally:
        r = runner.invoke(app, ["cluster", "down", "--state-dir", sd])
    assert r.exit_code == 0, r.output


# ---- the API over a live controller (no Ray) ------------------------------------------------


def H(token: str) -> dict[str, str]:  # noqa: N802
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Any]:
    """A controller with one emulated node, its observer and the API with its observe routes;
    users admin, alice and bob (jobs as ``nobody``/``daemon`` when run as root)."""
    from fastapi.testclient import TestClient

    from miso.api import UserStore, create_app
    from miso.controller import Controller
    from miso.controller.storefile import open_store
    from miso.observe import attach
    from miso.observe.routes import api_routers
    from miso.transport.inprocess import LocalTransport

    d = tmp_path / "state"
    transport = LocalTransport()
    transport.add(Agent("node0", EmulatedBackend(1, node="node0"), d / "agents" / "node0"))
    ctl = Controller(open_store(d), transport, ControllerConfig(**FAST),
                     checkpoint_root=d / "checkpoints")
    obs = attach(ctl, d)
    ctl.start()
    users = UserStore(d / "users.db")
    tokens = {"admin": users.add("admin", admin=True, unix_user="daemon"),
              "alice": users.add("alice", unix_user="nobody"),
              "bob": users.add("bob", unix_user="daemon")}
    app = create_app(ctl, users, extra_routers=api_routers(ctl, obs, "127.0.0.1"),
                     snapshot_ttl=0.0)
    with TestClient(app) as client:
        yield client, tokens, ctl, users, obs
    ctl.stop(stop_jobs=True)
    ctl.store.close()
    transport.agents()["node0"].shutdown()


def test_request_id__reused_with_another_payload_is_409_with_one_line(api: Any) -> None:
    client, tokens, *_ = api
    body = {"command": ["sleep", "30"], "name": "first", "request_id": "req-12345678"}
    r1 = client.post("/api/v1/jobs", json=body, headers=H(tokens["alice"]))
    assert r1.status_code == 201
    again = client.post("/api/v1/jobs", json=body, headers=H(tokens["alice"]))
    assert again.status_code == 201 and again.json() == r1.json()  # a retry: the same job
    for other in ({**body, "name": "second"}, {**body, "command": ["sleep", "31"]},
                  {**body, "env": {"A": "1"}}):
        r = client.post("/api/v1/jobs", json=other, headers=H(tokens["alice"]))
        assert r.status_code == 409, r.text
        msg = r.json()["error"]
        assert "request_id" in msg and "\n" not in msg and r1.json()["id"] in msg
    # another user's request id is theirs: no clash, no view of alice's job
    r = client.post("/api/v1/jobs", json={**body, "name": "b"}, headers=H(tokens["bob"]))
    assert r.status_code == 201 and r.json()["id"] != r1.json()["id"]


@pytest.mark.parametrize("unix", ["0", "root", "no-such-account-x", "999999"])
def test_unix_user__must_exist_and_must_not_be_root(api: Any, unix: str) -> None:
    from miso.api.users import UserError

    client, tokens, _, users, _ = api
    r = client.post("/api/v1/users", json={"name": "mallory", "unix_user": unix},
                    headers=H(tokens["admin"]))
    assert r.status_code == 400, r.text
    msg = r.json()["error"]
    assert "\n" not in msg and unix in msg
    with pytest.raises(UserError, match="root|no Unix account"):
        users.add("mallory", unix_user=unix)
    assert client.post("/api/v1/users", json={"name": "carol", "unix_user": "nobody"},
                       headers=H(tokens["admin"])).status_code == 201


def _dump(client: Any, token: str) -> str:
    """Every view a user has: status, jobs, events, the page's cluster view, /metrics."""
    out = []
    for path in ("/api/v1/status", "/api/v1/jobs", "/api/v1/events", "/api/v1/cluster",
                 "/metrics", "/"):
        r = client.get(path, headers=H(token))
        assert r.status_code == 200, (path, r.text)
        out.append(r.text)
    return "\n".join(out)


def test_views__a_non_admin_sees_other_users_jobs_as_counts_only(api: Any) -> None:
    client, tokens, ctl, *_ = api
    bobs = [client.post("/api/v1/jobs", json={"command": ["sleep", "30"],
                                              "name": f"bobsecret{i}"},
                        headers=H(tokens["bob"])).json()["id"] for i in range(3)]
    mine = client.post("/api/v1/jobs", json={"command": ["sleep", "30"], "name": "alicejob"},
                       headers=H(tokens["alice"])).json()["id"]
    # placed and planned (a job may fail at once where its account cannot reach the test's
    # state dir: the views are what this test is about, and the decisions name every job)
    wait_for(lambda: not any(j["state"] == "queued" for j in ctl.status()["jobs"]) and
             "ApplyLayout" in _dump(client, tokens["admin"]), 30)
    seen = _dump(client, tokens["alice"])
    assert mine in seen and "alicejob" in seen
    for secret in [*bobs, "bobsecret", "bob"]:
        assert secret not in seen, secret
    st = client.get("/api/v1/status", headers=H(tokens["alice"])).json()
    assert sum(st["counts"]["all"].values()) == 4  # the others as counts
    assert "bobsecret0" in _dump(client, tokens["admin"])  # admins see everything


def test_metrics__need_a_token_unless_the_operator_opts_out(api: Any) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from miso.observe.routes import api_routers

    client, tokens, ctl, _, obs = api
    client.post("/api/v1/jobs", json={"command": ["sleep", "30"], "name": "bobsecret"},
                headers=H(tokens["bob"]))
    assert client.get("/metrics").status_code == 401  # loopback, no token
    assert client.get("/metrics", headers=H("miso_wrong")).status_code == 401
    assert client.get("/metrics", headers=H(tokens["alice"])).status_code == 200
    public = FastAPI()
    for r in api_routers(ctl, obs, "127.0.0.1", metrics_public=True):
        public.include_router(r)
    with TestClient(public) as anon:
        r = anon.get("/metrics")
        assert r.status_code == 200 and "miso_jobs" in r.text and "bob" not in r.text


# ---- 6. users have ids that are never reused ------------------------------------------------


def test_users__a_recreated_name_is_a_new_user_without_the_old_jobs(api: Any) -> None:
    client, tokens, _, users, _ = api
    old_id = users.get("bob").id
    jid = client.post("/api/v1/jobs", json={"command": ["sleep", "30"], "name": "bobjob"},
                      headers=H(tokens["bob"])).json()["id"]
    assert client.delete("/api/v1/users/bob", headers=H(tokens["admin"])).status_code == 200
    r = client.post("/api/v1/users", json={"name": "bob", "unix_user": "daemon"},
                    headers=H(tokens["admin"]))
    assert r.status_code == 201
    new = r.json()["token"]
    assert users.get("bob").id != old_id
    assert client.get(f"/api/v1/jobs/{jid}", headers=H(new)).status_code in (403, 404)
    assert client.get("/api/v1/jobs/bobjob", headers=H(new)).status_code in (403, 404)
    assert client.get(f"/api/v1/jobs/{jid}/logs", headers=H(new)).status_code in (403, 404)
    assert client.post(f"/api/v1/jobs/{jid}/cancel", headers=H(new)).status_code in (403, 404)
    assert client.get("/api/v1/jobs", headers=H(new)).json()["jobs"] == []
    st = client.get("/api/v1/status", headers=H(new)).json()
    assert st["jobs"] == [] and sum(st["counts"]["mine"].values()) == 0
    assert jid not in _dump(client, new)
    # the new bob may use the old name for a job of his own
    assert client.post("/api/v1/jobs", json={"command": ["true"], "name": "bobjob"},
                       headers=H(new)).status_code == 201


def test_users__old_stores_with_names_are_migrated_to_ids(tmp_path: Path) -> None:
    from miso.api.head import migrate_owners
    from miso.api.users import UserStore
    from miso.controller.storefile import open_store

    users = UserStore(tmp_path / "users.db")
    users.add("alice", unix_user="nobody")
    users.add("gone", unix_user="nobody")
    store = open_store(tmp_path)  # an older store: owners are names
    a = store.submit(command=["true"], name="x", memory_gb=1.0, owner="alice").id
    g = store.submit(command=["true"], name="y", memory_gb=1.0, owner="gone").id
    op = store.submit(command=["true"], name="z", memory_gb=1.0).id
    users.remove("gone")
    users.add("gone", unix_user="nobody")  # re-created after the job: not its owner
    assert migrate_owners(store, users) == 2
    assert store.get(a).owner == users.get("alice").id
    assert store.get(g).owner not in (users.get("gone").id, "gone")
    assert store.get(op).owner is None
    assert migrate_owners(store, users) == 0  # once


@pytest.mark.parametrize("damage", ["missing", "empty", "garbage"])
def test_users_db__missing_or_damaged_with_jobs_refuses_to_start(tmp_path: Path,
                                                                  damage: str) -> None:
    from miso.api.head import users_of, users_problem
    from miso.controller.storefile import open_store

    sd = tmp_path / "state"
    users = users_of(sd)
    users.add("alice", admin=True, unix_user="nobody")
    users.close()
    assert users_problem(sd) is None
    store = open_store(sd)
    store.submit(command=["true"], name="x", memory_gb=1.0, owner="u:whatever")
    store.close()
    assert users_problem(sd) is None
    db = sd / "users.db"
    for side in sd.glob("users.db-*"):
        side.unlink()
    if damage == "missing":
        db.unlink()
    else:
        db.write_bytes(b"" if damage == "empty" else b"not a database at all" * 100)
    problem = users_problem(sd)
    assert problem is not None and "\n" not in problem and "users.db" in problem
    runner, app = _cli()
    r = runner.invoke(app, ["cluster", "up", "--emulated", "--state-dir", str(sd)])
    assert r.exit_code != 0 and "users.db" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert db.exists() is (damage != "missing")  # nothing was created in its place


# ---- 7. tokens and cluster up/down ----------------------------------------------------------


def _cli() -> Any:
    from typer.testing import CliRunner

    from miso.cli import app

    return CliRunner(), app


def test_token__empty_is_an_error_not_the_operator_token(tmp_path: Path) -> None:
    runner, app = _cli()
    (tmp_path / "api.json").write_text('{"url": "http://127.0.0.1:9"}')
    (tmp_path / "operator.token").write_text("miso_operator\n")
    r = runner.invoke(app, ["status", "--state-dir", str(tmp_path), "--token", ""])
    assert r.exit_code == 2 and "--token" in r.output and "empty" in r.output, r.output
    (tmp_path / "tok").write_text("\n")
    r = runner.invoke(app, ["status", "--state-dir", str(tmp_path), "--token-file",
                            str(tmp_path / "tok")])
    assert r.exit_code == 2 and "empty" in r.output, r.output


def test_token__from_a_file_or_the_environment_and_help_says_so(tmp_path: Path,
                                                                  monkeypatch: Any) -> None:
    cli_client = _client_module()
    runner, app = _cli()
    seen: list[str] = []

    class Fake:
        def __init__(self, url: str, token: str, ca: str | None = None) -> None:
            seen.append(token)

        def __enter__(self) -> Fake:
            return self

        def __exit__(self, *a: object) -> None:
            return None

        def status(self, limit: int) -> dict[str, Any]:
            return {"gpus": [], "jobs": [], "counts": {}}

    import miso.api.client

    monkeypatch.setattr(miso.api.client, "Client", Fake)  # imported where it is used
    if hasattr(cli_client, "Client"):  # or at the top of the command module
        monkeypatch.setattr(cli_client, "Client", Fake)
    monkeypatch.setenv("MISO_CONFIG", str(tmp_path / "none.json"))
    (tmp_path / "tok").write_text("miso_fromfile\n")
    url = ["--url", "http://127.0.0.1:9"]
    assert runner.invoke(app, ["status", *url, "--token-file", str(tmp_path / "tok")]
                         ).exit_code == 0
    monkeypatch.setenv("MISO_TOKEN", "miso_fromenv")
    assert runner.invoke(app, ["status", *url]).exit_code == 0
    assert seen == ["miso_fromfile", "miso_fromenv"]
    for cmd in (["status"], ["submit"], ["user", "add"]):
        text = " ".join(runner.invoke(app, [*cmd, "--help"]).output.split())
        assert "--token-file" in text and "MISO_TOKEN" in text and "process list" in text


def test_cluster_up__emulated_gpus_are_bounded_with_one_line(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    from miso import raycluster as rc

    runner, app = _cli()
    started: list[int] = []
    monkeypatch.setattr(rc, "spawn_local_head", lambda sd, **kw: started.append(kw["gpus"]))
    r = runner.invoke(app, ["cluster", "up", "--emulated", "--gpus", "100000", "--state-dir",
                            str(tmp_path / "s")])
    assert r.exit_code == 2 and "--gpus" in r.output and "1024" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not started


@pytest.mark.slow
@pytest.mark.ray
def test_cluster_down__stops_a_head_whose_up_was_interrupted(tmp_path: Path) -> None:
    import signal
    import subprocess

    from miso import raycluster as rc

    sd = str(tmp_path / "state")
    up = subprocess.Popen([sys.executable, "-m", "miso.cli",
                           "cluster", "up", "--emulated", "--gpus", "1", "--state-dir", sd],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})

    def head() -> int | None:
        for e in os.scandir("/proc"):
            if e.name.isdigit():
                try:
                    argv = Path(f"/proc/{e.name}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if rc.HEAD_MARK.encode() in argv and os.fsencode(sd) in argv:
                    return int(e.name)
        return None

    pid = wait_for(head, 60)
    up.send_signal(signal.SIGKILL)  # `cluster up` hung or was interrupted
    up.wait()
    r = _cli()[0].invoke(_cli()[1], ["cluster", "down", "--state-dir", sd])
    assert r.exit_code == 0, r.output
    assert not rc.running(pid)  # dead (a zombie until init reaps it is not running)


def test_views__hidden_job_ids_are_masked_inside_free_text_too() -> None:
    """A decision's explanation text ("starts jobs j0002, j0003, j0004") names other users'
    jobs: a non-admin's view replaces each hidden id inside any string, keeping its own."""
    from miso.observe.view import OTHER, mask

    rec = {"kind": "ApplyLayout", "detail": "starts jobs j0002, j0003, j0004",
           "text": "plan 2\n    job j0002 -> 3g\n    job j0004 -> 2g", "jobs": ["j0002", "j0004"]}
    out = mask(rec, {"j0002", "j0003"})
    assert out["detail"] == f"starts jobs {OTHER}, {OTHER}, j0004"
    assert "j0002" not in str(out) and "j0003" not in str(out) and "j0004" in out["text"]
    assert out["jobs"] == [OTHER, "j0004"]
