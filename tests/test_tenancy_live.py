"""Tenancy on the live cluster (issue 16, item 6): owners' weights and quotas kept in the store
and changed while the controller runs (`miso quota`), priorities at submission, the per-owner
view and what a user who is not an admin may see of it, and fair share on a full emulated
cluster."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    CLIENT_ENV,
    FAST,
    AcceptingPlans,
    TurnRecorder,
    emu,
    run_cli,
    served_cluster,
)
from waiting import wait_for

from miso.controller import Controller, ControllerConfig, QuotaExceeded, SubmitError
from miso.controller.owners import OTHERS, owner_table, owner_view
from miso.controller.quotas import Quota, QuotaStore, tenancy_config
from miso.controller.storefile import open_store
from miso.sched.tenancyconfig import TenancyConfig


def H(token: str) -> dict[str, str]:  # noqa: N802
    return {"Authorization": f"Bearer {token}"}


# ---- the store and the pure parts ------------------------------------------------------------


def test_quota_store__set_keeps_other_fields_none_clears_and_bounds_refuse(tmp_path: Path):
    qs = QuotaStore(tmp_path / "miso.db")
    assert qs.set("u:a", "alice", weight=2.0) == Quota("u:a", "alice", weight=2.0)
    q = qs.set("u:a", "alice", max_queued=3)
    assert (q.weight, q.max_queued) == (2.0, 3)  # the weight is kept
    for bad in ({"weight": 0.0}, {"weight": float("nan")}, {"max_in_use": -1.0},
                {"max_queued": -1}, {"priority_limit": 10**9}, {"colour": 1}):
        with pytest.raises(ValueError) as e:
            qs.set("u:a", "alice", **bad)
        assert "\n" not in str(e.value)
    assert qs.get("u:a") == q  # nothing written by a refused change
    assert qs.set("u:a", "alice", weight=None, max_queued=None).empty
    assert qs.get("u:a") is None and qs.list() == []  # an all-default row is not kept
    qs.set_priority("j0001", 100)
    qs.set_priority("j0002", 0)
    assert qs.priorities(["j0001", "j0002", "j0003"]) == {"j0001": 100}


def test_tenancy_config__stored_quotas_over_the_operators_and_alone_turn_tenancy_on():
    assert tenancy_config(None, []) is None
    assert tenancy_config(None, [Quota("u:a", "a", priority_limit=100)]) is None
    alone = tenancy_config(None, [Quota("u:a", "a", max_in_use=1.5)])
    assert alone is not None and not alone.fair_share and alone.max_in_use == {"u:a": 1.5}
    base = TenancyConfig(half_life_s=60.0, weights={"u:a": 1.0, "u:b": 3.0})
    got = tenancy_config(base, [Quota("u:a", "a", weight=2.0, max_queued=4)])
    assert got is not None and got.half_life_s == 60.0 and got.fair_share
    assert got.weights == {"u:a": 2.0, "u:b": 3.0} and got.max_queued == {"u:a": 4}


def test_owner_view__a_non_admin_sees_its_row_and_the_others_as_counts_only():
    report = {"u:a": {"usage_gpu_s": 300.0, "in_use": 1.0, "weight": 1.0, "fair_share": 0.3,
                      "queued": 99, "running": 2},
              "u:b": {"usage_gpu_s": 100.0, "in_use": 3 / 7, "weight": 3.0, "fair_share": 0.9,
                      "queued": 1, "running": 1}}
    table = owner_table(report, [Quota("u:b", "bob", weight=3.0, max_queued=5),
                                 Quota("u:c", "carol", max_in_use=2.0)],
                        {"u:a": "alice", "u:b": "bob"})
    assert table["u:a"]["usage_share"] == pytest.approx(0.75)
    assert table["u:b"]["share"] == pytest.approx(3 / 5)      # weights 1, 3, 1 (carol)
    assert table["u:c"]["name"] == "carol" and table["u:c"]["queued"] == 0
    admin = owner_view(table, None)
    assert [r["owner"] for r in admin] == ["alice", "bob", "carol"]
    assert admin[1]["max_queued"] == 5 and admin[1]["id"] == "u:b"
    mine = owner_view(table, "u:b")
    assert mine[0]["owner"] == "bob" and mine[0]["queued"] == 1
    assert mine[1] == {"owner": OTHERS, "owners": 2, "in_use": pytest.approx(1.0),
                       "usage_share": pytest.approx(0.75), "share": pytest.approx(0.4),
                       "held": 0.0, "entitled": 0.0, "queued": 99, "running": 2}
    text = json.dumps(mine)
    assert "alice" not in text and "carol" not in text and "u:a" not in text
    nobody = owner_view(table, "u:z", "zed")  # a user with no job and no quota
    assert nobody[0]["owner"] == "zed" and nobody[0]["queued"] == 0
    assert nobody[1]["owners"] == 3




def test_controller__a_quota_change_reaches_the_loop_and_the_next_decision_uses_it():
    from miso.controller.runtime import GpuRef
    from miso.controller.store import JobStore
    from miso.mig import geometry
    from miso.sched import GpuAdded, make_policy
    from miso.sched.clock import VirtualClock

    con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                     ControllerConfig(policy="nopart", tenancy=TenancyConfig(),
                                      check_commands=False),
                     checkpoint_root="/nonexistent", clock=VirtualClock(),
                     policy=make_policy("nopart"))
    con.loop.executor = AcceptingPlans()  # type: ignore[assignment]
    for i in range(2):
        con.rt.gpus[f"g{i}"] = GpuRef(f"g{i}", "n0", i, "A100-40GB", geometry("A100-40GB"))
        con.loop.handle(("event", GpuAdded(f"g{i}", "A100-40GB")))

    def drain() -> None:
        while con.loop.run_once():
            pass

    con.set_quota("u:a", "alice", max_in_use=0.0)
    drain()
    held = con.submit(["train"], memory_gb=4.0, owner="u:a", owner_name="alice")
    drain()
    st = con.loop.state
    assert st.jobs[held].gpu is None
    assert con.cluster()["held"][held].startswith("owner alice holds 0.00 of its 0 ")
    con.set_quota("u:a", "alice", max_in_use=None)
    drain()
    assert st.tenancy is not None and st.tenancy.config.max_in_use == {}
    assert st.jobs[held].gpu is None        # nothing decided yet: no event
    con.submit(["train"], memory_gb=4.0, owner="u:b", owner_name="bob")
    drain()
    assert st.jobs[held].gpu is not None    # the next decision placed it
    assert con.cluster()["owners"]["u:a"]["name"] == "alice"


# ---- the live API ------------------------------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Any]:
    """A controller with tenancy (fair share) over one emulated node of one GPU, with the API
    and its observe routes; users admin, alice, bob."""
    from fastapi.testclient import TestClient

    from miso.agent import Agent
    from miso.api import UserStore, create_app
    from miso.backend.emulated import EmulatedBackend
    from miso.observe import attach
    from miso.observe.routes import api_routers
    from miso.transport.inprocess import LocalTransport

    d = tmp_path / "state"
    transport = LocalTransport()
    transport.add(Agent("node0", EmulatedBackend(1, node="node0"), d / "agents" / "node0"))
    cfg = ControllerConfig(**FAST, tenancy=TenancyConfig())  # type: ignore[arg-type]
    ctl = Controller(open_store(d), transport, cfg, checkpoint_root=d / "checkpoints")
    obs = attach(ctl, d)
    ctl.start()
    users = UserStore(d / "users.db")
    tokens = {"admin": users.add("admin", admin=True), "alice": users.add("alice"),
              "bob": users.add("bob")}
    app = create_app(ctl, users, extra_routers=api_routers(ctl, obs, "127.0.0.1"),
                     snapshot_ttl=0.0)
    with TestClient(app) as client:
        yield client, tokens, ctl, users
    ctl.stop(stop_jobs=True)
    ctl.store.close()
    transport.agents()["node0"].shutdown()


def _submit(client: Any, token: str, **body: Any) -> Any:
    return client.post("/api/v1/jobs", json={"command": ["sleep", "30"], **body},
                       headers=H(token))


def test_api__quota_set_show_round_trip_and_admin_only_one_line_errors(api: Any) -> None:
    client, tokens, ctl, users = api
    admin, alice = H(tokens["admin"]), H(tokens["alice"])
    r = client.put("/api/v1/quotas/alice", json={"weight": 2, "max_in_use": 1.5,
                                                 "max_queued": 10, "priority_limit": "high"},
                   headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["quota"] == {"owner": "alice", "id": users.get("alice").id, "weight": 2.0,
                                 "max_in_use": 1.5, "max_queued": 10, "priority_limit": 100}
    assert r.json()["tenancy"]["on"] and r.json()["tenancy"]["live"]
    # a partial change keeps the rest; null clears one
    r = client.put("/api/v1/quotas/alice", json={"max_in_use": None}, headers=admin)
    assert r.json()["quota"]["max_in_use"] is None and r.json()["quota"]["weight"] == 2.0
    got = client.get("/api/v1/quotas", headers=admin).json()
    assert [(q["owner"], q["max_queued"]) for q in got["quotas"]] == [("alice", 10)]
    assert client.get("/api/v1/quotas/bob", headers=admin).json()["quota"]["weight"] is None
    # the running controller took it: the loop's tenancy has alice's weight (by id)
    wait_for(lambda: ctl.loop.state.tenancy.config.weight(users.get("alice").id) == 2.0, 10)
    for method, path, body, code in (
            ("put", "/api/v1/quotas/bob", {"weight": 5}, 403),
            ("get", "/api/v1/quotas", None, 403),
            ("delete", "/api/v1/quotas/alice", None, 403)):
        r = client.request(method, path, json=body, headers=alice)
        assert r.status_code == code and "not an admin" in r.json()["error"]
        assert "\n" not in r.json()["error"]
    for body in ({"weight": 0}, {"weight": "lots"}, {"max_queued": -1}, {"max_in_use": 1e9},
                 {"priority_limit": "urgent"}, {"colour": "red"}):
        r = client.put("/api/v1/quotas/alice", json=body, headers=admin)
        assert r.status_code == 422, (body, r.text)
        assert "\n" not in r.json()["error"]
    r = client.put("/api/v1/quotas/nobody", json={"weight": 1}, headers=admin)
    assert r.status_code == 404 and r.json()["error"] == "no user 'nobody'"
    r = client.delete("/api/v1/quotas/alice", headers=admin)
    assert r.status_code == 200 and r.json()["had_quota"]
    assert client.get("/api/v1/quotas", headers=admin).json()["quotas"] == []
    audit = [e["action"] for e in users.audit(user="admin")]
    assert audit.count("quota-set") == 2 and "quota-clear" in audit


def test_api__accounts_above_users_reach_the_loop_and_survive_in_the_store(api: Any) -> None:
    """alice and bob join account ``lab`` (weight 2) by PUT /quotas/{name} ``account``; the
    running loop's tenancy has them in it; GET /quotas lists the accounts; bad names and
    weights are one-line 4xx; a non-admin may not set them."""
    client, tokens, ctl, users = api
    admin, alice = H(tokens["admin"]), H(tokens["alice"])
    for who in ("alice", "bob"):
        r = client.put(f"/api/v1/quotas/{who}", json={"account": "lab"}, headers=admin)
        assert r.status_code == 200, r.text
    r = client.put("/api/v1/accounts/lab", json={"weight": 2}, headers=admin)
    assert r.status_code == 200 and r.json() == {"account": "lab", "weight": 2.0}
    a, b = users.get("alice").id, users.get("bob").id
    wait_for(lambda: ctl.loop.state.tenancy.config.accounts == {a: "lab", b: "lab"}
             and ctl.loop.state.tenancy.config.account_weights == {"lab": 2.0}, 10)
    ten = ctl.loop.state.tenancy.config
    assert ten.account_weight(ten.account_of(a)) == 2.0
    got = client.get("/api/v1/quotas", headers=admin).json()
    assert got["accounts"] == {"lab": 2.0}
    assert got["account_members"] == {"alice": "lab", "bob": "lab"}
    assert ctl.quotas.accounts() == ({a: "lab", b: "lab"}, {"lab": 2.0})   # in the store
    for path, body in (("/api/v1/accounts/lab", {"weight": 0}),
                       ("/api/v1/quotas/alice", {"account": "no spaces"})):
        r = client.put(path, json=body, headers=admin)
        assert r.status_code == 422 and "\n" not in r.json()["error"], r.text
    r = client.put("/api/v1/accounts/bad name", json={"weight": 1}, headers=admin)
    assert r.status_code == 400 and "account 'bad name'" in r.json()["error"]
    r = client.put("/api/v1/accounts/lab", json={"weight": 5}, headers=alice)
    assert r.status_code == 403
    r = client.put("/api/v1/quotas/bob", json={"account": None}, headers=admin)
    wait_for(lambda: ctl.loop.state.tenancy.config.accounts == {a: "lab"}, 10)


def test_api__queued_quota_refusal_is_429_with_its_line_and_a_change_applies_at_once(
        api: Any) -> None:
    client, tokens, ctl, _ = api
    admin = H(tokens["admin"])
    assert client.put("/api/v1/quotas/alice", json={"max_queued": 0},
                      headers=admin).status_code == 200
    r = _submit(client, tokens["alice"], name="a1")
    assert r.status_code == 429, r.text
    assert r.json()["error"] == "owner alice already has 0 queued jobs (quota 0)"
    assert _submit(client, tokens["bob"]).status_code == 201  # bob has no quota
    client.put("/api/v1/quotas/alice", json={"max_queued": None}, headers=admin)
    assert _submit(client, tokens["alice"], name="a1").status_code == 201  # no restart


def test_api__priority_above_normal_needs_an_admin_or_a_limit(api: Any) -> None:
    client, tokens, ctl, _ = api
    r = _submit(client, tokens["alice"], priority="high")
    assert r.status_code == 403 and "priority 100" in r.json()["error"]
    assert "--priority-limit" in r.json()["error"]
    assert _submit(client, tokens["alice"], priority="low").status_code == 201
    assert _submit(client, tokens["alice"], priority="urgent").status_code == 422
    client.put("/api/v1/quotas/alice", json={"priority_limit": 50},
               headers=H(tokens["admin"]))
    assert _submit(client, tokens["alice"], priority=51).status_code == 403
    jid = _submit(client, tokens["alice"], priority=50).json()["id"]
    wait_for(lambda: jid in ctl.loop.state.jobs, 10)
    assert ctl.loop.state.jobs[jid].spec.priority == 50
    st = client.get("/api/v1/status", headers=H(tokens["alice"])).json()
    assert {j["id"]: j["priority"] for j in st["jobs"]}[jid] == 50
    assert ctl.quotas.priorities([jid]) == {jid: 50}   # kept for a restart
    assert _submit(client, tokens["admin"], priority="high").status_code == 201


def test_api__in_use_quota_wait_says_why_by_name_and_owners_view_obeys_counts_only(
        api: Any) -> None:
    client, tokens, ctl, _ = api
    admin = H(tokens["admin"])
    client.put("/api/v1/quotas/alice", json={"max_in_use": 0}, headers=admin)
    wait_for(lambda: ctl.loop.state.tenancy.config.max_in_use, 10)
    mine = _submit(client, tokens["alice"], name="alicejob").json()["id"]
    bobs = _submit(client, tokens["bob"], name="bobsecret").json()["id"]
    # bob's job settles first (runs, or fails to start as root without a Unix account): the
    # two views below are read at two moments and must see the same owners
    def settled() -> bool:
        state = ctl.store.get(bobs).state
        return state == "running" or (state == "failed" and not any(
            bobs in gs.jobs for gs in list(ctl.loop.state.gpus.values())))

    wait_for(settled, 20)

    def why() -> str:
        st = client.get("/api/v1/status", headers=H(tokens["alice"])).json()
        return next(j["why"] for j in st["jobs"] if j["id"] == mine)

    wait_for(lambda: "quota" in why(), 20)
    assert why().startswith("waiting: owner alice holds 0.00 of its 0 GPU-equivalent quota")
    st = client.get("/api/v1/status", headers=H(tokens["alice"])).json()
    assert st["owners"][0]["owner"] == "alice" and st["owners"][0]["queued"] == 1
    assert st["owners"][0]["max_in_use"] == 0
    assert st["owners"][1]["owner"] == "others" and st["owners"][1]["owners"] == 1
    page = client.get("/api/v1/cluster", headers=H(tokens["alice"])).json()
    assert page["owners"] == st["owners"]
    for view in (st, page):
        assert "bob" not in json.dumps(view)
    full = client.get("/api/v1/status", headers=admin).json()["owners"]
    assert {r["owner"] for r in full} == {"alice", "bob"}
    metrics = client.get("/metrics", headers=H(tokens["alice"])).text
    assert 'miso_owner_gpu_equivalents{owner="alice"}' in metrics and "bob" not in metrics


def test_restart__quotas_and_priorities_survive_and_apply_from_the_start(tmp_path: Path):
    from miso.cluster.local import LocalCluster

    d = tmp_path / "c"
    cfg = ControllerConfig(**FAST)  # type: ignore[arg-type]
    with LocalCluster(d, nodes=0, config=cfg) as c:
        ctl = c.controller
        assert ctl is not None and ctl.loop.state.tenancy is None  # no tenancy asked for
        with pytest.raises(SubmitError, match="priorities need tenancy"):
            ctl.submit(["sleep", "30"], owner="u:a", priority=100)
        ctl.set_quota("u:a", "alice", max_queued=1, weight=3.0)
        assert ctl.tenancy_info() == {**ctl.tenancy_info(), "on": True, "live": False}
        ctl.submit(["sleep", "30"], owner="u:a", owner_name="alice")
        with pytest.raises(QuotaExceeded, match=r"^owner alice already has 1 queued jobs"):
            ctl.submit(["sleep", "30"], owner="u:a", owner_name="alice")  # enforced now
        c.crash_controller()
        ctl = c.start_controller()
        ten = ctl.loop.state.tenancy
        assert ten is not None and ten.config.weight("u:a") == 3.0  # stored quotas: on
        assert ctl.tenancy_info()["live"] and not ctl.tenancy_info()["fair_share"]
        with pytest.raises(QuotaExceeded):
            ctl.submit(["sleep", "30"], owner="u:a", owner_name="alice")
        hi = ctl.submit(["sleep", "30"], owner="u:b", owner_name="bob", priority=100)
        c.crash_controller()
        ctl = c.start_controller()
        wait_for(lambda: hi in ctl.loop.state.jobs, 10)
        assert ctl.loop.state.jobs[hi].spec.priority == 100
        assert [q.name for q in ctl.quotas.list()] == ["alice"]


# ---- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A live controller with tenancy (2 emulated GPUs) and its API as the head serves it."""
    for k in CLIENT_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = ControllerConfig(**FAST, tenancy=TenancyConfig())  # type: ignore[arg-type]
    with served_cluster(config, "miso-ten-") as out:
        yield out


_miso = run_cli


def test_cli__quota_set_show_submit_refused_with_one_line_and_status_owners(
        served: tuple[Path, str]) -> None:
    sd, url = served
    op = {"MISO_STATE_DIR": str(sd)}
    alice = _miso("user", "add", "alice", **op).stdout.strip().splitlines()[-1]
    me = {"MISO_URL": url, "MISO_TOKEN": alice}
    r = _miso("quota", "set", "alice", "--max-queued", "0", "--weight", "2", **op)
    assert r.exit_code == 0, r.output
    assert "quota of alice: weight 2, max in use -, max queued 0" in r.stdout
    r = _miso("quota", "show", "alice", "--json", **op)
    assert json.loads(r.stdout)["quota"]["max_queued"] == 0
    r = _miso("quota", "show", "--json", **op)
    got = json.loads(r.stdout)
    assert got["tenancy"]["fair_share"] and got["quotas"][0]["weight"] == 2.0
    r = _miso("submit", "--", "sleep", "30", **me)
    assert r.exit_code == 2
    assert r.output.strip() == "error: owner alice already has 0 queued jobs (quota 0)"
    r = _miso("quota", "set", "alice", "--max-queued", "none", **op)
    assert r.exit_code == 0 and "max queued -" in r.stdout
    r = _miso("submit", "--priority", "high", "--", "sleep", "30", **me)
    assert r.exit_code == 2 and "priority 100 is above" in r.output
    r = _miso("submit", "--priority", "soon", "--", "sleep", "30", **me)
    assert r.exit_code == 2 and "expected high, normal, low or an integer" in r.output
    assert _miso("submit", "--priority", "low", "--", "sleep", "30", **me).exit_code == 0
    r = _miso("quota", "show", **me)
    assert r.exit_code == 2 and "is not an admin" in r.output
    r = _miso("quota", "set", "alice", "--weight", "0", **op)
    assert r.exit_code == 2 and "--weight '0'" in r.output
    st = json.loads(_miso("status", "--json", **me).stdout)
    assert [o["owner"] for o in st["owners"]][0] == "alice"
    assert {"held", "entitled"} <= set(st["owners"][0])   # share received vs entitled
    r = _miso("status", **op)
    assert "Owners: usage against entitlement" in r.stdout and "alice" in r.stdout
    assert "held / entitled" in r.stdout


def test_cli__cluster_up_tenancy_flags_are_checked_and_become_the_controllers():
    from miso.cli.cluster import tenancy_options

    assert tenancy_options(False, None, False, None) is None
    got = tenancy_options(True, 3600.0, True, 30.0)
    assert got == {"fair_share": True, "preempt": True, "half_life_s": 3600.0,
                   "min_run_s": 30.0, "fairness_price": "stored"}
    cfg = ControllerConfig(**json.loads(json.dumps({"tenancy": got})))
    assert cfg.tenancy == TenancyConfig(half_life_s=3600.0, preempt=True, min_run_s=30.0)
    got = tenancy_options(True, None, False, None, reclaim=False, demand_per_job=1 / 3)
    assert ControllerConfig(tenancy=got).tenancy == TenancyConfig(reclaim=False,
                                                                  demand_per_job=1 / 3)
    for bad in (["--no-reclaim"], ["--demand-per-job", "0.5"],
                ["--fair-share", "--demand-per-job", "1.5"]):
        r = _miso("cluster", "up", "--emulated", "--state-dir", "/nonexistent/x", *bad)
        assert r.exit_code == 2 and "error: --" in r.output, r.output
    for args in ((False, 60.0, False, None), (True, 0.0, False, None),
                 (True, None, False, 5.0), (False, None, True, -0.5),
                 (True, float("inf"), False, None)):
        r = _miso("cluster", "up", "--emulated", "--state-dir", "/nonexistent/x",
                  *(["--fair-share"] if args[0] else []),
                  *(["--preempt"] if args[2] else []),
                  *(["--half-life", str(args[1])] if args[1] is not None else []),
                  *(["--min-run-s", str(args[3])] if args[3] is not None else []))
        assert r.exit_code == 2 and "error: --" in r.output, r.output


# ---- the live target ---------------------------------------------------------------------------


def _emu_job(work_s: float) -> dict[str, Any]:
    """An emulated job as a body of ``POST /jobs``: as root, users' jobs run as ``nobody``,
    who cannot reach this venv's Python; the system's Python runs it from the source tree."""
    import miso

    cmd = emu("resnet_train64", work_s)
    if os.geteuid() != 0:
        return {"command": cmd}
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no system python3 for jobs run as nobody")
    return {"command": [system, *cmd[1:]],
            "env": {"PYTHONPATH": str(Path(miso.__file__).resolve().parents[1])}}


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["nopart", "miso+"])
def test_live__b_starts_within_one_completion_after_a_floods_a_full_cluster(
        tmp_path: Path, policy: str) -> None:
    """User A submits 100 jobs onto a full emulated cluster, then user B submits 1: with
    fair share B's job takes the first room that frees (FIFO: after A's 100). "Within one
    completion" is one turn of the loop: the completions reported together (or waiting
    together while it was busy) are handled as one group with one placement pass, which
    must place B before any of A's jobs."""
    from fastapi.testclient import TestClient

    from miso.api import UserStore, create_app
    from miso.cluster.local import LocalCluster

    d = Path(tempfile.mkdtemp(prefix="miso-ten-"))  # under /tmp: jobs' accounts reach it
    # as `miso cluster up --fair-share --fairness-price 0.05` configures it
    from miso.cli.cluster import tenancy_options

    ten = tenancy_options(True, None, False, None, fairness_price=0.05)
    assert ten == {"fair_share": True, "preempt": False, "fairness_price": 0.05}
    cfg = ControllerConfig(**FAST, policy=policy, tenancy=ten)  # type: ignore[arg-type]
    unix = "nobody" if os.geteuid() == 0 else None  # as root, users' jobs need an account
    with LocalCluster(d, gpus_per_node=2, config=cfg) as c:
        ctl = c.controller
        assert ctl is not None
        turns = TurnRecorder()
        ctl.observer = turns  # which events each decision followed, turn by turn
        users = UserStore(d / "users.db")
        ta, tb = users.add("usera", unix_user=unix), users.add("userb", unix_user=unix)
        with TestClient(create_app(ctl, users, snapshot_ttl=0.0)) as client:
            a = [client.post("/api/v1/jobs", headers=H(ta), json={
                **_emu_job(6.0 if i % 2 else 4.0), "name": f"a{i:03d}"}).json()["id"]
                 for i in range(100)]
            # full: A's jobs run on every GPU and the rest wait
            wait_for(lambda: sum(r.state == "running" for r in ctl.store.jobs()) >= 2
                     and ctl.store.counts().get("queued", 0) >= 80, 60)
            assert not ctl.store.counts().get("failed")
            b = client.post("/api/v1/jobs", headers=H(tb), json={
                **_emu_job(2.0), "name": "b"}).json()["id"]
            wait_for(lambda: ctl.store.get(b).started_at is not None, 120)
            # the status: each owner's GPUs held against its entitlement, and the regime
            st = client.get("/api/v1/status", headers=H(ta)).json()
            assert st["owners"][0]["owner"] == "usera" and "entitled" in st["owners"][0]
            assert ctl.cfg.tenancy is not None and ctl.cfg.tenancy.fairness_price == 0.05
        recs = {r.id: r for r in ctl.store.jobs()}
        assert recs[b].state != "failed" and all(recs[j].state != "failed" for j in a)
        # The loop's own record, turn by turn. The events waiting together in its queue are
        # one group whose placement pass runs once, at the group's end: two of A's jobs that
        # end within one poll (or while the loop is busy) are handled together, and B's
        # placement then follows both in the log, from the first pass after room freed.
        # The promise: B is placed in the turn that handles the first completion after its
        # submission (no earlier turn's completion left it waiting), and before any of A's.
        seen = turns.seen
        sub = next(k for k, (_, _, kind, job) in enumerate(seen)
                   if kind == "JobSubmitted" and job == b)
        placed = next(k for k, (_, _, kind, job) in enumerate(seen)
                      if k > sub and kind == "decision:PlaceJob" and job == b)
        turn_b = seen[placed][0]
        ends = [t for t, _, kind, _ in seen[sub + 1:placed] if kind in ("JobFinished",
                                                                        "JobFailed")]
        earlier = sum(t < turn_b for t in ends)
        overtook = sum(kind == "decision:PlaceJob" for _, _, kind, _ in seen[sub + 1:placed])
        print(f"{policy}: B placed {seen[placed][1] - seen[sub][1]:.1f} s after its "
              f"submission, in the turn of {len(ends) - earlier} completion(s) of A's jobs "
              f"handled together, after {earlier} handled in earlier turns; A's jobs placed "
              f"before it: {overtook}; B started "
              f"{recs[b].started_at - recs[b].submitted_at:.1f} s after its submission")
        assert earlier == 0 and overtook == 0
        # the store's event log says the same order (the observer sees what it records)
        log = ctl.store.events()
        k_sub = next(k for k, e in enumerate(log) if e["kind"] == "JobSubmitted"
                     and e["body"]["job"]["id"] == b)
        k_placed = next(k for k, e in enumerate(log) if k > k_sub
                        and e["kind"] == "decision:PlaceJob" and e["body"]["job"] == b)
        assert sum(e["kind"] in ("JobFinished", "JobFailed")
                   for e in log[k_sub + 1:k_placed]) == len(ends)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(),
                    reason="needs Debian's chromium (apt-get install chromium)")
def test_web_page__owners_table_in_chromium_counts_only_for_a_non_admin(tmp_path: Path):
    """The page's Owners table: a user sees its own row and the others as one row of counts
    (no other name anywhere on the page); an admin sees every owner."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from miso.api import UserStore, create_app
    from miso.api.server import ApiServer, Listen
    from miso.cluster.local import LocalCluster
    from miso.observe import attach
    from miso.observe.routes import api_routers

    cfg = ControllerConfig(**FAST, tenancy=TenancyConfig())  # type: ignore[arg-type]
    with LocalCluster(tmp_path / "c", nodes=0, config=cfg, start=False) as c:
        ctl = Controller(open_store(tmp_path / "c"), c.transport, cfg,
                         checkpoint_root=tmp_path / "c" / "checkpoints")
        obs = attach(ctl, tmp_path / "c")
        c.controller = ctl.start()
        users = UserStore(":memory:")
        tokens = {"admin": users.add("admin", admin=True), "alice": users.add("alice"),
                  "bob": users.add("bob")}
        server = ApiServer(create_app(ctl, users, extra_routers=api_routers(ctl, obs),
                                      snapshot_ttl=0.0), Listen("127.0.0.1", 0))
        url = server.start()
        try:
            import httpx

            for who, n in (("bob", 2), ("alice", 1)):
                for i in range(n):
                    r = httpx.post(url + "/api/v1/jobs", headers=H(tokens[who]),
                                   json={"command": ["sleep", "30"], "name": f"{who}job{i}"})
                    assert r.status_code == 201, r.text
            httpx.put(url + "/api/v1/quotas/alice", headers=H(tokens["admin"]),
                      json={"weight": 3, "max_queued": 7})
            with sync_api.sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                            args=["--headless", "--no-sandbox", "--disable-gpu"])
                for who, want in (("alice", ["alice", "others (1)"]),
                                  ("admin", ["alice", "bob"])):
                    page = browser.new_page()
                    page.goto(url + "/")
                    page.get_by_label("API token").fill(tokens[who])
                    page.keyboard.press("Enter")
                    page.locator("#owners tbody tr").first.wait_for(timeout=20_000)
                    wait_for(lambda page=page, want=want: [
                        t.split("\t")[0].strip()
                        for t in page.locator("#owners tbody tr").all_inner_texts()] == want,
                        20)
                    rows = page.locator("#owners tbody tr").all_inner_texts()
                    assert "3.00" in rows[0] and "- / 7" in rows[0].replace("\u2013", "-")
                    if who == "alice":
                        assert "bob" not in page.content()
                        assert "\t2" in rows[1]   # bob's 2 queued jobs, as a count
                    page.close()
                browser.close()
        finally:
            server.stop()


def test_fairness_price__cluster_up_keeps_it_in_the_store_for_the_next_starts(tmp_path: Path):
    """`cluster up --fair-share --fairness-price 0.1` keeps 0.1; a later `--fair-share` start
    without it uses the kept one; a fresh cluster the default 0.05; `--demand-per-job` fixes
    the cap instead (no price); out-of-range prices are refused."""
    from miso.cli.cluster import tenancy_options
    from miso.controller.quotas import QuotaStore, with_price

    qs = QuotaStore(tmp_path / "jobs.db")
    fresh = ControllerConfig(tenancy=tenancy_options(True, None, False, None))
    assert fresh.fairness_price_stored
    assert with_price(fresh.tenancy, qs, True).fairness_price == 0.05  # type: ignore[union-attr]
    given = ControllerConfig(tenancy=tenancy_options(True, None, False, None,
                                                     fairness_price=0.1))
    assert with_price(given.tenancy, qs, given.fairness_price_stored).fairness_price == 0.1  # type: ignore[union-attr]
    assert QuotaStore(tmp_path / "jobs.db").fairness_price() == 0.1      # durable
    assert with_price(fresh.tenancy, qs, True).fairness_price == 0.1  # type: ignore[union-attr]
    fixed = ControllerConfig(tenancy=tenancy_options(True, None, False, None,
                                                     demand_per_job=0.5))
    assert not fixed.fairness_price_stored
    assert with_price(fixed.tenancy, qs, False).fairness_price is None  # type: ignore[union-attr]
    assert with_price(None, qs, True) is None
    with pytest.raises(ValueError, match="fairness price"):
        qs.set_fairness_price(2.0)
    for bad in (["--fairness-price", "0.05"],
                ["--fair-share", "--fairness-price", "1.5"],
                ["--fair-share", "--fairness-price", "0.05", "--demand-per-job", "0.5"]):
        r = _miso("cluster", "up", "--emulated", "--state-dir", "/nonexistent/x", *bad)
        assert r.exit_code == 2 and "error: --" in r.output, r.output
