"""Private state and isolated jobs: file modes, jobs run as their owner's uid, one job cannot
read another's checkpoint. The CI runs as root, so real uids are used (65534 is ``nobody``;
65533 needs no passwd entry); without root those tests are skipped."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from miso.agent import Agent, runas
from miso.backend import EmulatedBackend
from miso.controller import JobStore

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def state() -> Iterator[Path]:
    # under /tmp (not pytest's 0700 tmp root) so the jobs' accounts can reach their directories
    d = Path(tempfile.mkdtemp(prefix="miso-iso-"))
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def make_agent(state: Path) -> Agent:
    agent = Agent("node0", EmulatedBackend(1, "A100-40GB"), state / "agents" / "node0")
    assert agent.apply_layout(0, [[0, "7g.40gb"]])["ok"]
    return agent


def launch(agent: Agent, state: Path, job: str, script: str, *, owner: str | None,
           unix_user: str | None) -> dict:
    return agent.launch({"job": job, "attempt": 1, "command": ["/bin/sh", "-c", script],
                         "gpu": 0, "placement": [0, "7g.40gb"], "mps_pct": None,
                         "checkpoint_dir": str(state / "checkpoints" / job), "resume_from": None,
                         "env": {}, "cwd": "/", "owner": owner, "unix_user": unix_user})


def finished(agent: Agent, job: str) -> dict | None:
    rep = [a for a in agent.report()["jobs"] if a["job"] == job]
    return rep[0] if rep and rep[0]["status"] != "running" else None


def test_accounts_resolve_and_an_owner_without_account_is_refused_as_root() -> None:
    nobody = runas.resolve("65534")
    assert (nobody.uid, nobody.gid) == (65534, 65534)
    assert runas.resolve("nobody").uid == 65534
    assert runas.resolve("4000123") == runas.Account("4000123", 4000123, 4000123)
    with pytest.raises(runas.RunAsError, match="no Unix account"):
        runas.resolve("no-such-user-xyz")
    assert runas.account_for(None, None) is None
    if os.geteuid() == 0:
        with pytest.raises(runas.RunAsError, match="has no Unix account"):
            runas.account_for("bob", None)
        assert runas.popen_kwargs(nobody)["user"] == 65534
    else:
        assert runas.account_for("bob", "nobody") is None
    assert runas.popen_kwargs(None) == {"umask": 0o077}


def test_state_files_are_private(state: Path) -> None:
    store = JobStore(state / "miso.db")
    store.submit(command=["true"], name=None, memory_gb=1.0)
    agent = make_agent(state)
    launch(agent, state, "j1", "echo hi; echo saved > $MISO_CHECKPOINT_DIR/ck",
           owner=None, unix_user=None)
    wait_for(lambda: finished(agent, "j1"))
    att = state / "agents" / "node0" / "jobs" / "j1" / "attempt-1"
    store.backup(state / "miso.db.bak")
    assert mode(state / "miso.db") == 0o600
    assert {mode(p) for p in state.glob("miso.db*")} == {0o600}
    assert (state / "miso.db.bak").exists()
    assert mode(state / "agents" / "node0") == 0o700
    assert mode(att.parent) == mode(att) == mode(att / "job") == 0o700
    assert mode(att / "output.log") == 0o600 and "hi" in agent.logs("j1")
    assert mode(state / "checkpoints" / "j1") == 0o700
    assert mode(state / "checkpoints" / "j1" / "ck") == 0o600  # the job's umask is 077
    agent.shutdown()


@root_only
def test_job_runs_as_its_owner_and_cannot_read_another_jobs_checkpoint(state: Path) -> None:
    os.chmod(state, 0o700)
    agent = make_agent(state)
    a_ck = state / "checkpoints" / "ja" / "checkpoint.json"
    os.environ["AGENT_SECRET"] = "of-the-agent"
    try:
        r = launch(agent, state, "ja", 'id -u; id -g; echo "$HOME $USER"; '
                   'echo "secret=$AGENT_SECRET path=$PATH"; '
                   'echo secret-of-a > "$MISO_CHECKPOINT_DIR/checkpoint.json"',
                   owner="alice", unix_user="nobody")
    finally:
        del os.environ["AGENT_SECRET"]
    assert r["ok"], r
    assert wait_for(lambda: finished(agent, "ja"))["status"] == "finished"
    assert agent.logs("ja").splitlines()[1:] == [
        "65534", "65534", "/nonexistent nobody", f"secret= path={runas.DEFAULT_PATH}"]
    assert a_ck.read_text() == "secret-of-a\n"
    assert (a_ck.parent.stat().st_uid, mode(a_ck.parent)) == (65534, 0o700)
    assert (a_ck.stat().st_uid, mode(a_ck)) == (65534, 0o600)
    # B (another uid) can reach its own directories but not A's checkpoint, nor list others
    r = launch(agent, state, "jb", f'id -u; cat {a_ck} || echo DENIED-FILE; '
               f'ls {state / "checkpoints"} || echo DENIED-LIST; '
               'echo mine > "$MISO_CHECKPOINT_DIR/own" && echo WROTE-OWN; '
               f'echo x > {a_ck.parent}/evil || echo DENIED-WRITE',
               owner="bob", unix_user="65533")
    assert r["ok"], r
    assert wait_for(lambda: finished(agent, "jb"))
    out = agent.logs("jb")
    assert "65533" in out and "secret-of-a" not in out
    for word in ("DENIED-FILE", "DENIED-LIST", "WROTE-OWN", "DENIED-WRITE"):
        assert word in out, out
    assert not (a_ck.parent / "evil").exists()
    assert mode(state) == 0o701  # traverse only, for the jobs' accounts; no listing
    # the owner's log is the agent's (root's) file, not the job's
    log = state / "agents" / "node0" / "jobs" / "jb" / "attempt-1" / "output.log"
    assert (log.stat().st_uid, mode(log)) == (0, 0o600)
    agent.shutdown()


@root_only
def test_an_owner_without_unix_account_does_not_run_as_root(state: Path) -> None:
    agent = make_agent(state)
    r = launch(agent, state, "jc", "id -u", owner="carol", unix_user=None)
    assert not r["ok"] and "has no Unix account" in r["error"]
    r = launch(agent, state, "jd", "id -u", owner="dave", unix_user="no-such-user-xyz")
    assert not r["ok"] and "no Unix account 'no-such-user-xyz'" in r["error"]
    agent.shutdown()


@root_only
def test_a_job_cannot_redirect_the_agent_through_symlinks(state: Path) -> None:
    agent = make_agent(state)
    target = state / "root-only"
    target.write_text("root secret")
    os.chmod(target, 0o600)
    r = launch(agent, state, "je", 'ln -s /dev/zero "$MISO_PROGRESS_FILE"; '
               'rm -f "$MISO_CHECKPOINT_FLAG"; '
               f'ln -s {state}/created-by-root "$MISO_CHECKPOINT_FLAG"; sleep 30',
               owner="eve", unix_user="nobody")
    assert r["ok"], r
    wait_for(lambda: Path(os.readlink(state / "agents/node0/jobs/je/attempt-1/job/"
                                      "checkpoint.request")) if os.path.islink(
        state / "agents/node0/jobs/je/attempt-1/job/checkpoint.request") else None)
    rep = agent.report()  # reading a symlinked progress file neither blocks nor follows
    assert rep["jobs"][0]["iteration"] is None
    assert agent.checkpoint("je", 1)
    assert not (state / "created-by-root").exists()
    agent.shutdown()
