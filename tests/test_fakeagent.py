"""The fake node agent (jobs as timers, no processes): it speaks the agent protocol, so the real
controller places, profiles, checkpoints, requeues and finishes its jobs."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers import FAST, emu
from waiting import wait_for

from miso.agent.fakeagent import FakeAgent
from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig
from miso.mig import Placement


def _spec(job: str, attempt: int, cmd: list[str], *, resume: str | None = None,
          pl: Placement = Placement(0, "7g.40gb")) -> dict[str, Any]:
    return {"job": job, "attempt": attempt, "command": cmd, "gpu": 0,
            "placement": [pl.start, pl.profile], "mps_pct": None, "resume_from": resume}


def _job(rep: dict[str, Any], job: str) -> dict[str, Any]:
    return next(a for a in rep["jobs"] if a["job"] == job)


def test_fakeagent__runs_checkpoints_resumes_and_finishes_as_the_workload() -> None:
    ag = FakeAgent("n0", 1)
    assert ag.apply_layout(0, [[0, "7g.40gb"]])["ok"]
    assert ag.launch(_spec("j", 1, emu("resnet_train128", 0.6, ips=100.0)))["ok"]
    # a running job holds its instance, as a process would
    assert not ag.apply_layout(0, [])["ok"]
    time.sleep(0.2)
    a = _job(ag.report(time.time() + 30), "j")
    assert a["status"] == "running" and 5 < a["iteration"] < 60 and a["total"] == 60
    assert ag.checkpoint("j", 1)
    a = _job(ag.report(), "j")
    assert a["status"] == "checkpointed" and a["checkpoint_iteration"] == a["iteration"]
    ag.forget("j", 1)
    assert not ag.launch(_spec("j", 1, emu("resnet_train128", 0.6, ips=100.0)))["ok"]
    assert ag.launch(_spec("j", 2, emu("resnet_train128", 0.6, ips=100.0),
                           resume=a["checkpoint_path"]))["ok"]
    b = _job(ag.report(), "j")
    assert b["start_iteration"] == a["checkpoint_iteration"]
    wait_for(lambda: _job(ag.report(), "j")["status"] == "finished", 5)
    assert _job(ag.report(), "j")["iteration"] == 60


def test_fakeagent__a_lapsed_lease_fences_and_a_small_slice_runs_out_of_memory() -> None:
    ag = FakeAgent("n0", 1)
    assert ag.apply_layout(0, [[0, "4g.20gb"], [4, "1g.5gb"]])["ok"]
    assert ag.launch(_spec("big", 1, emu("bert_train2", 1.0),
                           pl=Placement(4, "1g.5gb")))["ok"]
    assert ag.launch(_spec("j", 1, emu("resnet_train128", 100.0),
                           pl=Placement(0, "4g.20gb")))["ok"]
    rep = ag.report(time.time() + 0.1)
    big = _job(rep, "big")
    if big["status"] == "failed":  # bert_train2 does not fit 1g.5gb in the A100 table
        assert "out of memory" in big["log_tail"]
    time.sleep(0.2)
    assert _job(ag.report(), "j")["status"] == "fenced"


@pytest.mark.slow  # ~5 s: profiling levels and a lease running out
def test_fakeagent__the_real_controller_drives_a_fake_cluster(tmp_path: Path) -> None:
    cfg = ControllerConfig(**{**FAST, "lease_s": 1.0,
                              "policy_args": {"profile_when": "always"}})
    wls = ["resnet_train128", "bert_train2", "gnn_train512", "mobilenet_train128"]
    with LocalCluster(tmp_path, nodes=2, gpus_per_node=2, config=cfg, fake=True,
                      rate_window=0.5) as c:
        for i in range(6):
            c.submit(emu(wls[i % 4], 0.6 + 0.2 * (i % 3)), name=f"job{i}")
        ctl = c.controller
        assert ctl is not None
        wait_for(lambda: sum(j.state == "running" and (j.gpu or "").startswith("node1")
                             for j in ctl.store.jobs()) >= 1, 30)
        c.transport.remove("node1")  # the node dies with its jobs
        assert ctl.wait_all(90), ctl.status()
        jobs = ctl.store.jobs()
        assert all(j.state == "finished" and j.iteration == j.total for j in jobs), \
            [(j.id, j.state, j.reason) for j in jobs]
        by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for a in ctl.store.attempts():
            by_job[a["job"]].append(a)
        assert all(sum(a["status"] == "finished" for a in by_job[j.id]) == 1 for j in jobs)
        statuses = {a["status"] for a in ctl.store.attempts()}
        assert "checkpointed" in statuses and "lost" in statuses, statuses
        assert ctl.store.events("ProfilingFinished")
        assert not ctl.errors


def test_the_ray_actor_class_serves_a_fake_agent_with_an_incarnation() -> None:
    from miso.cluster.fakeactors import FakeAgentActor

    actor = FakeAgentActor("f0", 2)  # the class Ray runs (called here without Ray)
    with pytest.raises(Exception, match="has not joined"):
        actor.apply_layout(0, [[0, "7g.40gb"]])  # refused before the controller adopts it
    desc = actor.describe()
    assert desc["incarnation"] and [g["index"] for g in desc["gpus"]] == [0, 1]
    assert actor.apply_layout(0, [[0, "7g.40gb"]])["ok"]
    assert actor.launch(_spec("j", 1, emu("resnet_train128", 5.0)))["ok"]
    rep = actor.report(time.time() + 30)
    assert rep["incarnation"] == desc["incarnation"] and rep["jobs"][0]["status"] == "running"
    actor.shutdown()
    assert actor.report()["jobs"][0]["status"] == "killed"
