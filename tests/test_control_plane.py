"""The control plane under attack and failure (issue 15, items 3, 6, 7): agents that come back,
users with ids, and the smaller holes (request ids, tokens, /metrics, views, cluster up/down)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

from miso.agent import Agent
from miso.backend import EmulatedBackend
from miso.controller import ControllerConfig
from miso.controller.local import LocalCluster

FAST = dict(profile_seconds_per_level=0.3, profile_warmup_s=0.15, checkpoint_timeout=3.0,
            poll_interval=0.1, lease_s=2.0, poll_timeout=1.0, discover_interval=0.3)


def emu(work_s: float, ips: float = 40.0) -> list[str]:
    return [sys.executable, "-m", "miso.emuworkload", "--workload", "bert_train2",
            "--iterations", str(int(work_s * ips)), "--ips", str(ips),
            "--checkpoint-every", "0.3"]


class Incarnated(Agent):
    """An agent that says which life of it answers (as the Ray agent actor does)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.incarnation = uuid.uuid4().hex

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "incarnation": self.incarnation}

    def report(self, lease_until: float | None = None) -> dict[str, Any]:
        return {**super().report(lease_until), "incarnation": self.incarnation}


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "c", nodes=0, config=ControllerConfig(**FAST), start=False,
                     rate_window=0.5)
    c.transport.add(Incarnated("node0", EmulatedBackend(2, node="node0"),
                               c.dir / "agents" / "node0", rate_window=0.5))
    c.start_controller()
    yield c
    c.close()


# ---- 3. agents are supervised ---------------------------------------------------------------


def test_agent_restart__node_is_lost_fenced_and_its_jobs_finish_once(local: LocalCluster) -> None:
    ctl = local.controller
    assert ctl is not None
    ids = [local.submit(emu(2.0), name=f"j{i}") for i in range(3)]
    wait_for(lambda: sum(j["state"] == "running" for j in ctl.status()["jobs"]) >= 2, 60)
    old = local.transport.agents()["node0"]
    # the agent dies (its jobs' guards kill them) and its supervisor starts a new one at once
    local.transport.add(Incarnated("node0", EmulatedBackend(2, node="node0"),
                                   local.dir / "agents" / "node0", rate_window=0.5))
    old.shutdown()
    st = wait_for(lambda: (s := ctl.status())["lost_nodes"] and s, 20)
    lost = st["lost_nodes"][0]
    assert lost["node"] == "node0" and lost["since"] > 0 and "restarted" in lost["why"]
    assert any("node0 lost since" in e for e in st["errors"])
    assert ctl.wait_all(120), ctl.status()
    recs = local.controller.store.jobs()
    assert [r.state for r in recs] == ["finished"] * 3 and {r.id for r in recs} == set(ids)
    assert not ctl.status()["lost_nodes"]  # the new agent joined
    for j in ids:  # one attempt per life of the agent at most: never two at once
        ends = [a for a in ctl.store.attempts(j) if a["status"] == "finished"]
        assert len(ends) <= 1


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
        assert "LOST" in r.output or not c.status()["lost_nodes"], r.output
        wait_for(lambda: all(j["state"] == "finished" for j in c.status()["jobs"]), 240)
        stop.set()
        t.join(5)
        assert {j["id"] for j in c.status()["jobs"]} == set(ids)
        assert max(most.values()) == 1, most
        assert rc.local_agent_pids(sd) and rc.local_agent_pids(sd) != [pid]
        assert not c.status()["lost_nodes"]
    finally:
        r = runner.invoke(app, ["cluster", "down", "--state-dir", sd])
    assert r.exit_code == 0, r.output
