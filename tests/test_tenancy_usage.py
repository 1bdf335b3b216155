"""Tenancy on the live cluster, second part: owners' decayed usage survives a controller
restart (a heavy user's fair-share debt is not wiped), and a job held back by fair share says
why, naming other owners only to an admin."""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import FAST, AcceptingPlans
from waiting import wait_for

from miso.controller import Controller, ControllerConfig
from miso.controller.owners import fair_wait_reason
from miso.controller.store import JobStore
from miso.controller.usagestore import UsageStore
from miso.sched.tenancy import UsageRecord
from miso.sched.tenancyconfig import TenancyConfig

LN2 = math.log(2.0)
#: As root, users' jobs need a Unix account to run as (and a state dir it can reach: /tmp).
UNIX = "nobody" if os.geteuid() == 0 else None


# ---- the pure parts ----------------------------------------------------------------------------


def test_usage_record__settled_charges_its_rate_then_decays_by_hand():
    # 2 GPU-equivalents held from t=50 on, half-life 100 s, 40 GPU-s already as of t=50
    r = UsageRecord("u:a", 40.0, 60.0, 2.0, 50.0, 100.0)
    s = r.settled(250.0)
    # 40 x 2^-2 + integral of 2 x 2^-(250-t)/100 over [50, 250] = 10 + 2 x (100/ln2) x 3/4
    assert s.usage == pytest.approx(10.0 + 150.0 / LN2)
    assert (s.total, s.rate, s.as_of) == (pytest.approx(460.0), 0.0, 250.0)
    assert s.settled(350.0).usage == pytest.approx(s.usage / 2)  # nothing held: decay only
    assert r.settled(10.0) == UsageRecord("u:a", 40.0, 60.0, 0.0, 50.0, 100.0)  # no time back


def test_usage_store__keeps_the_last_record_per_owner_and_skips_damaged_rows(tmp_path: Path):
    us = UsageStore(tmp_path / "miso.db")
    us.save([UsageRecord("u:a", 1.0, 2.0, 0.5, 10.0, 60.0),
             UsageRecord("u:b", 3.0, 3.0, 0.0, 10.0, 60.0)])
    us.save([UsageRecord("u:a", 5.0, 6.0, 0.0, 20.0, 60.0)])
    with sqlite3.connect(tmp_path / "miso.db") as db:   # rows damaged by hand
        db.execute("INSERT INTO owner_usage VALUES('u:x', 'lots', 1, 0, 1, 60)")
        db.execute("INSERT INTO owner_usage VALUES('u:y', 1, 1, 0, 1, 0)")
    assert [(r.owner, r.usage, r.as_of) for r in us.load()] == [("u:a", 5.0, 20.0),
                                                                ("u:b", 3.0, 10.0)]
    us.close()


def test_fair_wait_reason__others_by_name_for_an_admin_counts_only_otherwise():
    fw = {"owner": "bob", "held": 9.1, "entitlement": 8.0, "over": False,
          "ahead": {"alice": 2, "carol": 1}}
    mine = fair_wait_reason(fw, admin=False)
    assert mine == ("waiting under fair share: owner bob holds 9.1 GPUs of its 8.0 "
                    "entitlement; 3 jobs of 2 owners who used less of their share lately go "
                    "first")
    assert fair_wait_reason(fw, admin=True) == mine + " (2 jobs of alice, 1 of carol)"
    over = fair_wait_reason({**fw, "held": 10.0, "over": True, "ahead": {}}, admin=False)
    assert over == ("waiting under fair share: owner bob holds 10.0 GPUs, more than its "
                    "entitlement of 8.0: its jobs get only the room owners within theirs leave")
    order_only = fair_wait_reason({**fw, "entitlement": None, "ahead": {"alice": 1}},
                                  admin=False)
    assert order_only == ("waiting under fair share: 1 job of 1 owner who used less of their "
                          "share lately goes first")


# ---- a restart on a virtual clock --------------------------------------------------------------




def _hand_controller(path: Path, t: float,
                     ten: TenancyConfig | None = None) -> Controller:
    """A controller over the store at ``path`` on a virtual clock at ``t``, one A100 (nopart:
    one job per GPU), fair share with a 100 s half-life; started as :meth:`Controller.start`
    would (its usage restored) without agents or threads."""
    from miso.controller.runtime import GpuRef
    from miso.mig import geometry
    from miso.sched import GpuAdded, make_policy
    from miso.sched.clock import VirtualClock

    con = Controller(JobStore(path), None,  # type: ignore[arg-type]
                     ControllerConfig(policy="nopart",
                                      tenancy=ten or TenancyConfig(half_life_s=100.0),
                                      check_commands=False),
                     checkpoint_root="/nonexistent", clock=VirtualClock(t),
                     policy=make_policy("nopart"))
    con.loop.executor = AcceptingPlans()  # type: ignore[assignment]
    con.restore_usage()
    con.rt.gpus["g0"] = GpuRef("g0", "n0", 0, "A100-40GB", geometry("A100-40GB"))
    con.loop.handle(("event", GpuAdded("g0", "A100-40GB")))
    return con


def _drain(con: Controller) -> None:
    while con.loop.run_once():
        pass


def test_restart__decayed_usage_is_restored_exactly_and_the_order_still_favours_b(
        tmp_path: Path):
    from miso.sched import JobFinished

    path = tmp_path / "miso.db"
    con = _hand_controller(path, 0.0)
    a = con.submit(["train"], memory_gb=4.0, owner="u:a", owner_name="alice")
    _drain(con)
    assert con.loop.state.jobs[a].gpu == "g0"        # alice holds the whole GPU from t=0
    con.rt.clock.advance_to(100.0)  # type: ignore[attr-defined]
    con.loop.handle(("event", JobFinished(a)))       # ... to t=100
    con.store.close()

    con = _hand_controller(path, 300.0)               # the restart, 200 s later
    ten = con.loop.state.tenancy
    assert ten is not None
    # by hand: integral over [0, 100] of 2^-((300 - t) / 100) = (100 / ln 2)(2^-2 - 2^-3)
    assert ten.usage_at("u:a", 300.0) == pytest.approx(100.0 / LN2 * (0.25 - 0.125))
    assert ten.usage_at("u:a", 400.0) == pytest.approx(100.0 / LN2 * 0.125 / 2)
    assert ten.usage_at("u:b", 300.0) == 0.0
    c = con.submit(["train"], memory_gb=4.0, owner="u:c", owner_name="carol")  # fills g0
    a2 = con.submit(["train"], memory_gb=4.0, owner="u:a", owner_name="alice")
    b2 = con.submit(["train"], memory_gb=4.0, owner="u:b", owner_name="bob")
    _drain(con)
    st = con.loop.state
    assert st.jobs[c].gpu == "g0" and st.queue == [a2, b2]
    assert ten.order(st.queue) == [b2, a2]            # alice's debt survived the restart
    jobs = {j["id"]: j for j in con.status()["jobs"]}
    assert jobs[a2]["why"] == ("waiting under fair share: owner alice holds 0.0 GPUs of its "
                               "0.3 entitlement; 1 job of 1 owner who used less of their "
                               "share lately goes first")
    assert not jobs[b2]["why"].startswith("waiting under fair share")
    con.store.close()


def test_restart__a_clean_stop_settles_the_usage_so_the_time_down_is_not_charged(
        tmp_path: Path):
    path = tmp_path / "miso.db"
    con = _hand_controller(path, 0.0)
    con.submit(["train"], memory_gb=4.0, owner="u:a", owner_name="alice")
    _drain(con)
    con.rt.clock.advance_to(50.0)  # type: ignore[attr-defined]
    con.transport = con.rt.transport = _NoNodes()  # type: ignore[assignment]
    con.stop(stop_jobs=True)                         # `miso cluster down` at t=50
    con.store.close()
    (rec,) = UsageStore(path).load()
    assert (rec.rate, rec.as_of) == (0.0, 50.0)
    assert rec.usage == pytest.approx(100.0 / LN2 * (1 - 2 ** -0.5))
    con = _hand_controller(path, 250.0)               # up again 200 s later
    ten = con.loop.state.tenancy
    assert ten is not None and ten.usage_at("u:a", 250.0) == pytest.approx(rec.usage / 4)
    con.store.close()


def test_fair_waits__an_owner_over_its_entitlement_and_the_owners_ahead(tmp_path: Path):
    from miso.sched.fairwait import FairWait, fair_waits

    con = _hand_controller(tmp_path / "miso.db", 0.0,
                           TenancyConfig(half_life_s=100.0, keep_margin=0.0))
    con.submit(["train"], memory_gb=4.0, owner="u:a", owner_name="alice")  # holds g0
    _drain(con)
    con.rt.clock.advance_to(10.0)  # type: ignore[attr-defined]
    a2 = con.submit(["train"], memory_gb=4.0, owner="u:a", owner_name="alice")
    b = con.submit(["train"], memory_gb=4.0, owner="u:b", owner_name="bob")
    _drain(con)
    # one GPU: alice (2 jobs) and bob (1) each demand one, so each is entitled to half
    assert fair_waits(con.loop.state) == [(FairWait("u:a", 1.0, 0.5, True, {"u:b": 1}), [a2])]
    jobs = {j["id"]: j for j in con.status()["jobs"]}
    assert jobs[a2]["why"] == (
        "waiting under fair share: owner alice holds 1.0 GPUs, more than its entitlement of "
        "0.5: its jobs get only the room owners within theirs leave; 1 job of 1 owner who "
        "used less of their share lately goes first")
    assert not jobs[b]["why"].startswith("waiting under fair share")
    con.store.close()


class _NoNodes:
    def nodes(self) -> list[str]:
        return []


# ---- a restart of a real controller ------------------------------------------------------------


@pytest.fixture
def state_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="miso-ten-"))  # under /tmp: jobs' accounts reach it
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_restart__a_crashed_controllers_usage_comes_back_and_b_goes_first(state_dir: Path):
    from miso.cluster.local import LocalCluster

    cfg = ControllerConfig(**FAST, policy="nopart", tenancy=TenancyConfig())  # type: ignore[arg-type]
    with LocalCluster(state_dir, gpus_per_node=1, config=cfg) as c:
        ctl = c.controller
        assert ctl is not None
        a = ctl.submit(["sleep", "1"], owner="u:a", owner_name="alice", unix_user=UNIX)
        wait_for(lambda: ctl.store.get(a).state == "finished", 60)
        ten = ctl.loop.state.tenancy
        wait_for(lambda: ten.in_use.get("u:a") == 0.0, 10)
        before = ten.usage_at("u:a", ctl.now())
        assert before > 0.5                        # about a second on the whole GPU
        c.crash_controller()
        ctl = c.start_controller()
        ten = ctl.loop.state.tenancy
        assert ten is not None
        # a week's half-life: seconds later the debt is all there
        assert ten.usage_at("u:a", ctl.now()) == pytest.approx(before, rel=1e-3)
        busy = ctl.submit(["sleep", "60"])             # the operator's job fills the GPU
        wait_for(lambda: ctl.loop.state.jobs.get(busy) is not None
                 and ctl.loop.state.jobs[busy].gpu is not None, 20)
        a2 = ctl.submit(["sleep", "1"], owner="u:a", owner_name="alice", unix_user=UNIX)
        b = ctl.submit(["sleep", "1"], owner="u:b", owner_name="bob", unix_user=UNIX)
        wait_for(lambda: ctl.loop.state.queue == [a2, b], 10)
        assert ten.order(ctl.loop.state.queue) == [b, a2]
        why = wait_for(lambda: next(j["why"] for j in ctl.status()["jobs"] if j["id"] == a2)
                       .startswith("waiting under fair share") and ctl.status(), 10)
        text = next(j["why"] for j in why["jobs"] if j["id"] == a2)
        assert "1 job of 1 owner who used less of their share lately goes first" in text


# ---- the API: a non-admin and an admin ---------------------------------------------------------


def H(token: str) -> dict[str, str]:  # noqa: N802
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def api(state_dir: Path) -> Iterator[Any]:
    """A controller with fair share over one emulated GPU, one job per GPU (nopart), with the
    API and its observe routes; users admin, alice, bob."""
    from fastapi.testclient import TestClient

    from miso.agent import Agent
    from miso.api import UserStore, create_app
    from miso.backend.emulated import EmulatedBackend
    from miso.controller.storefile import open_store
    from miso.observe import attach
    from miso.observe.routes import api_routers
    from miso.transport.inprocess import LocalTransport

    d = state_dir / "state"
    transport = LocalTransport()
    transport.add(Agent("node0", EmulatedBackend(1, node="node0"), d / "agents" / "node0"))
    cfg = ControllerConfig(**FAST, policy="nopart", tenancy=TenancyConfig())  # type: ignore[arg-type]
    ctl = Controller(open_store(d), transport, cfg, checkpoint_root=d / "checkpoints")
    obs = attach(ctl, d)
    ctl.start()
    users = UserStore(d / "users.db")
    tokens = {"admin": users.add("admin", admin=True),
              "alice": users.add("alice", unix_user=UNIX),
              "bob": users.add("bob", unix_user=UNIX)}
    app = create_app(ctl, users, extra_routers=api_routers(ctl, obs, "127.0.0.1"),
                     snapshot_ttl=0.0)
    with TestClient(app) as client:
        yield client, tokens, ctl
    ctl.stop(stop_jobs=True)
    ctl.store.close()
    transport.agents()["node0"].shutdown()


def test_api__a_fair_share_wait_says_why_counts_only_to_its_owner_names_to_an_admin(
        api: Any) -> None:
    client, tokens, ctl = api

    def submit(who: str, name: str) -> str:
        r = client.post("/api/v1/jobs", json={"command": ["sleep", "30"], "name": name},
                        headers=H(tokens[who]))
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    b1 = submit("bob", "bobfirst")                  # bob takes the only GPU
    wait_for(lambda: ctl.loop.state.jobs.get(b1) is not None
             and ctl.loop.state.jobs[b1].gpu is not None, 20)
    b2 = submit("bob", "bobsecond")                 # queued before alice's ...
    a1 = submit("alice", "alicesecret")             # ... but alice has used nothing

    def why(who: str, job: str) -> str:
        st = client.get("/api/v1/status", headers=H(tokens[who])).json()
        return next((j["why"] for j in st["jobs"] if j["id"] == job), "")

    wait_for(lambda: why("bob", b2).startswith("waiting under fair share"), 20)
    text = why("bob", b2)
    assert text.startswith("waiting under fair share: owner bob holds 1.0 GPUs of its 0.5 "
                           "entitlement; 1 job of 1 owner who used less of their share "
                           "lately goes first"), text
    assert "alice" not in text and a1 not in text
    assert why("admin", b2) == text + " (1 job of alice)"
    assert not why("alice", a1).startswith("waiting under fair share")  # it goes first
    page = client.get("/api/v1/cluster", headers=H(tokens["bob"])).json()
    assert next(j["wait_reason"] for j in page["jobs"] if j["id"] == b2) == text
    assert "alice" not in json.dumps(page)
