"""The live system under faults and mistakes (issue 9): one controller per state dir, fencing
of hung nodes, idempotent submission, damaged stores, full disks, hostile names, units,
environment, logs after `down`, and the cluster-side bad inputs."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from helpers import FAST as BASE_FAST
from helpers import emu
from rich.console import Console
from typer.testing import CliRunner
from waiting import wait_for

from miso import job as jobhelper
from miso.agent import Agent
from miso.backend import EmulatedBackend
from miso.backend.emulated import pids_with_env
from miso.cli.client import logs, render_status, status, submit
from miso.cli.cluster import cluster_app
from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig, NodeUnavailable, StoreError, SubmitError
from miso.controller.offline import logs_from_disk
from miso.controller.statelock import StateDirLock, StateDirLocked
from miso.controller.storefile import open_store

FAST = {**BASE_FAST, "lease_s": 2.0, "poll_timeout": 1.0}

app = typer.Typer()
app.add_typer(cluster_app, name="cluster")
for _n, _f in [("submit", submit), ("status", status), ("logs", logs)]:
    app.command(_n)(_f)
runner = CliRunner()



@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    made: list[LocalCluster] = []

    def make(**kw: Any) -> LocalCluster:
        cfg = ControllerConfig(**{**FAST, **kw.pop("config", {})})
        c = LocalCluster(tmp_path / f"c{len(made)}", config=cfg, rate_window=0.5, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def running_copies(mark: str) -> dict[str, int]:
    """Live job processes (not their guards) per job id, from /proc."""
    out: dict[str, int] = {}
    for pid in pids_with_env("MISO_TEST_MARK", mark):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"guard.py" in a for a in argv):
            continue
        jid = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"MISO_JOB_ID=")),
                   "?")
        out[jid] = out.get(jid, 0) + 1
    return out


# ---- 1. one controller per state dir --------------------------------------------------------


def test_lock__second_controller_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path).acquire()
    with pytest.raises(StateDirLocked, match=f"PID {os.getpid()}"):
        StateDirLock(tmp_path).acquire()
    first.release()
    StateDirLock(tmp_path).acquire().release()
    # the OS drops the lock of a process that dies (even by SIGKILL)
    holder = subprocess.Popen([sys.executable, "-c", (
        f"import sys, time; sys.path.insert(0, {str(Path(jobhelper.__file__).parents[1])!r}); "
        "from miso.controller.statelock import StateDirLock; "
        f"StateDirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert StateDirLock(tmp_path).holder() == holder.pid
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert StateDirLock(tmp_path).holder() is None
    StateDirLock(tmp_path).acquire().release()


def test_lock__two_controllers_on_one_store(cluster) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    other = LocalCluster(c.dir, config=c.config, start=False)
    with pytest.raises(StateDirLocked, match="in use by a miso controller"):
        other.start_controller()
    other.close()


# ---- 2. fencing -----------------------------------------------------------------------------


def test_agent__lost_lease_kills_jobs_with_and_without_the_helper(tmp_path: Path) -> None:
    a = Agent("n0", EmulatedBackend(1), tmp_path / "agent", no_helper_after=0.3)
    try:
        a.apply_layout(0, [[0, "3g.20gb"], [4, "3g.20gb"]])
        a.report(time.time() + 1.5)
        for j, pl, cmd in (("h", [0, "3g.20gb"], emu("bert_train2", 600)),
                           ("x", [4, "3g.20gb"], ["sleep", "600"])):
            assert a.launch({"job": j, "attempt": 1, "command": cmd, "gpu": 0,
                             "placement": pl})["ok"]
        t0 = time.time()
        reps = wait_for(lambda: (r := a.report()["jobs"]) and
                        all(x["status"] != "running" for x in r) and r, 15)
        assert all(x["status"] == "fenced" for x in reps), reps
        assert time.time() - t0 < 6
        assert not a.running_pids()
    finally:
        a.shutdown()


def test_controller__hung_node_is_fenced_before_its_jobs_run_elsewhere(cluster) -> None:  # noqa: ANN001
    c = cluster(nodes=2, gpus_per_node=1)
    ctl = c.controller
    mark = f"hung-{os.getpid()}-{time.time()}"
    ids = [c.submit(emu(wl, 6.0, "--checkpoint-every", "0.3"), env={"MISO_TEST_MARK": mark})
           for wl in ("resnet_train128", "bert_train2")]
    wait_for(lambda: any(j.state == "running" and (j.gpu or "").startswith("node1")
                         for j in ctl.store.jobs()), 40)
    hung = {"on": True}

    def hook(node: str, method: str) -> None:
        if node == "node1" and hung["on"]:
            raise NodeUnavailable("node1 hangs")

    c.transport.hook = hook  # node1 stops answering; its processes go on until fenced
    worst = 0
    deadline = time.time() + 90
    while time.time() < deadline and not all(ctl.store.get(j).terminal for j in ids):
        worst = max(worst, *running_copies(mark).values(), 0)
        time.sleep(0.05)
    assert worst == 1, "a job ran twice at once"
    assert all(ctl.store.get(j).state == "finished" for j in ids), ctl.status()
    assert ctl.store.events("node-unreachable") and ctl.store.events("node-lost")
    for j in ids:
        atts = ctl.store.attempts(j)
        assert sum(a["status"] == "finished" for a in atts) == 1, atts


def test_controller__job_that_finished_on_a_hung_node_is_not_run_again(cluster) -> None:  # noqa: ANN001
    c = cluster(nodes=1, gpus_per_node=1, config={"lease_s": 4.0})
    ctl = c.controller
    j = c.submit(emu("bert_train2", 1.5))
    wait_for(lambda: ctl.store.get(j).state == "running", 30)
    hung_at = ctl.now()
    c.transport.hook = lambda node, method: (_ for _ in ()).throw(NodeUnavailable("hung"))
    agent = c.transport.agents()["node0"]
    wait_for(lambda: not agent.running_pids(), 30)  # it exits 0 while nobody hears
    c.transport.hook = None
    wait_for(lambda: ctl.store.get(j).terminal, 40)
    assert ctl.store.get(j).state == "finished"
    atts = ctl.store.attempts(j)
    assert sum(a["status"] == "finished" for a in atts) == 1, atts
    assert not [a for a in atts if a["started_at"] > hung_at], atts  # not run again


# ---- 4. idempotent submission ---------------------------------------------------------------


def test_submit__a_retry_with_the_same_request_id_returns_the_same_job(cluster) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    a = ctl.submit(["sleep", "0.1"], name="once", request_id="r-1")
    assert ctl.submit(["sleep", "0.1"], name="once", request_id="r-1") == a
    assert [r.id for r in ctl.store.jobs()] == [a]
    assert ctl.submit(["sleep", "0.1"], request_id="r-2") != a


# ---- 5/6. recovery and damaged stores -------------------------------------------------------


def test_recovery__resumes_from_the_helpers_record_when_the_store_missed_it(cluster) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    j = c.submit(emu("resnet_train128", 5.0, "--checkpoint-every", "0.3"))
    wait_for(lambda: (ctl.store.get(j).checkpoint_iteration or 0) > 20, 40)
    before = max(a["attempt"] for a in ctl.store.attempts(j))
    c.crash_controller()
    db = sqlite3.connect(c.dir / "miso.db")  # the store never heard of the checkpoint
    db.execute("UPDATE jobs SET checkpoint_iteration=NULL, checkpoint_path=NULL")
    db.execute("INSERT INTO attempts(job, attempt, node, gpu, placement, started_at) "
               "VALUES(?, 99, 'ghost', 'ghost/0', '0:7g.40gb', 0)", (j,))
    db.commit()
    db.close()
    ctl = c.start_controller()
    assert ctl.wait_all(60), ctl.status()
    atts = ctl.store.attempts(j)
    later = [a for a in atts if before < a["attempt"] < 99]
    assert later and later[0]["start_iteration"] > 20, atts
    assert next(a for a in atts if a["attempt"] == 99)["status"] == "lost"


@pytest.mark.parametrize("damage", ["truncate", "delete", "garbage"])
def test_store__damaged_or_missing_store_refuses_to_start(tmp_path: Path, damage: str) -> None:
    s = open_store(tmp_path)
    s.submit(command=["true"], name="a", memory_gb=1.0)
    s.close()
    s = open_store(tmp_path)  # a second start: the backup holds the job
    s.close()
    db = tmp_path / "miso.db"
    for side in tmp_path.glob("miso.db-*"):
        side.unlink()
    if damage == "truncate":
        db.write_bytes(b"")
    elif damage == "delete":
        db.unlink()
    else:
        db.write_bytes(b"this is no database" * 100)
    with pytest.raises(StoreError) as e:
        open_store(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "miso.db.bak" in msg and "afresh" in msg
    assert {"truncate": "empty", "delete": "missing", "garbage": "not a readable"}[damage] in msg
    os.replace(tmp_path / "miso.db.bak", db)  # the recovery the message names works
    assert [r.name for r in open_store(tmp_path).jobs()] == ["a"]


def test_store__ids_and_directories_are_never_reused(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "j0007").mkdir(parents=True)
    (tmp_path / "agents" / "node0" / "jobs" / "j0003").mkdir(parents=True)
    s = open_store(tmp_path)
    assert s.submit(command=["true"], name=None, memory_gb=1.0).id == "j0008"


def test_store__a_malformed_row_does_not_block_start_up(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    s = open_store(tmp_path / "c0")
    s.submit(command=["true"], name="bad", memory_gb=1.0)
    s.close()
    db = sqlite3.connect(tmp_path / "c0" / "miso.db")
    db.execute("UPDATE jobs SET command='{not json'")
    db.commit()
    db.close()
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    assert any("malformed" in e for e in ctl.status()["errors"])
    ok = c.submit(["true"], name="good")
    assert ctl.wait_all(30) and ctl.store.get(ok).state == "finished"


# ---- 7. full disk ---------------------------------------------------------------------------


def test_helper__storage_errors_never_reach_the_training_loop(tmp_path: Path,
                                                            monkeypatch) -> None:  # noqa: ANN001
    ctx = jobhelper.JobContext({"MISO_PROGRESS_FILE": str(tmp_path / "p.json"),
                                "MISO_CHECKPOINT_DIR": str(tmp_path / "ck")},
                               install_signal=False)

    def full(*_a: Any, **_k: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jobhelper, "write_json_atomic", full)
    for it in range(5):
        ctx.report(it, 10, force=True)
    assert ctx.save_json({"it": 5}, iteration=5) is None
    assert ctx.io_errors >= 6
    monkeypatch.undo()
    ctx.report(6, 10, force=True)  # the disk has room again: progress is written
    assert json.loads((tmp_path / "p.json").read_text())["iteration"] == 6


def test_submit__full_disk_fails_fast_with_one_line(cluster) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    real = ctl.store.db.conn  # inject ENOSPC into the store's one connection

    class Full:
        def execute(self, q: str, *a: Any) -> Any:
            if q.lstrip().upper().startswith(("INSERT", "BEGIN")):
                raise sqlite3.OperationalError("database or disk is full")
            return real.execute(q, *a)

    ctl.store.db.conn = Full()
    t0 = time.time()
    with pytest.raises(SubmitError, match="disk is full") as e:
        ctl.submit(["true"], name="x")
    assert time.time() - t0 < 2 and "\n" not in str(e.value)
    ctl.store.db.conn = real


# ---- 8. hostile text ------------------------------------------------------------------------


def test_status__user_text_is_escaped_for_rich_and_the_terminal() -> None:
    st = {"policy": "miso", "gpus": [], "jobs": [
        {"id": "j0001", "name": "[/bold]", "state": "failed", "restarts": 0,
         "why": "boom [red]x\x1b[31m" + "y" * 100},
        {"id": "j0002", "name": "\x1b]0;pwned\x07evil[bold]", "state": "queued",
         "restarts": 0, "why": ""}]}
    con = Console(record=True, width=300)
    for t in render_status(st):
        con.print(t)
    out = con.export_text()
    assert "[/bold]" in out and "[red]x" in out and "y" * 100 in out
    assert "\x1b" not in out and "\x07" not in out and "evil[bold]" in out


# ---- 10. no agent left ----------------------------------------------------------------------


def test_status__the_only_agents_death_is_an_error_not_a_silent_queue(cluster) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    c.transport.remove("node0")
    wait_for(lambda: ctl.status()["unreachable"] or not ctl.status()["gpus"], 20)
    j = c.submit(["sleep", "1"], name="waits")
    st = wait_for(lambda: (s := ctl.status()) and not s["gpus"] and s, 20)
    assert any("no agent is up" in e or "unreachable" in e for e in st["errors"]), st
    assert "no GPU node is up" in next(x for x in st["jobs"] if x["id"] == j)["why"]


# ---- 12/14. units, environment, logs, reasons, checkpointable -------------------------------


def test_submit__memory_in_gb_is_converted_to_gib(cluster) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    j = ctl.submit(["true"], memory_gb=40)  # 40 GB = 37.3 GiB < the 39.25 GiB 7g.40gb slice
    rec = ctl.store.get(j)
    assert rec.memory_gb == 40 and abs(rec.memory_gib - 37.25) < 0.01
    with pytest.raises(SubmitError, match=r"43 GB \(40.05 GiB\).*39.25 GiB = 42.1 GB"):
        ctl.submit(["true"], memory_gb=43)
    with pytest.raises(SubmitError, match="positive number of GB"):
        ctl.submit(["true"], memory_gb=float("nan"))


def test_job_env__set_at_submit_and_no_internals(cluster, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("RAY_SECRET_THING", "1")
    monkeypatch.setenv("MISO_AGENT_PID", "1")
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    out = c.dir / "env.txt"
    j = c.submit(["sh", "-c", f"env > {out}"], env={"FOO": "bar=baz"})
    assert ctl.wait_all(30) and ctl.store.get(j).state == "finished"
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert env["FOO"] == "bar=baz" and env["MISO_JOB_ID"] == j
    assert not any(k.startswith("RAY_") for k in env) and "MISO_AGENT_PID" not in env


def test_logs__read_from_disk_after_down_and_full_reasons(cluster, monkeypatch) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    long = "x" * 150
    j = c.submit(["sh", "-c", f"echo hello-from-job; echo {long} >&2; exit 3"], name="talky")
    assert ctl.wait_all(30)
    st = ctl.status()
    why = next(x for x in st["jobs"] if x["id"] == j)["why"]
    assert "exit code 3" in why and long in why  # not cut at 60 characters
    c.close()
    assert "hello-from-job" in logs_from_disk(c.dir, "talky", 10)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    r = runner.invoke(app, ["logs", "--state-dir", str(c.dir), "talky"])
    assert r.exit_code == 0 and "hello-from-job" in r.stdout, r.output


def test_checkpointable__a_helper_job_can_say_it_cannot_save(cluster) -> None:  # noqa: ANN001
    """``ctx.started(..., checkpointable=False)`` (here the emulated ``--no-checkpoint`` job)
    reports progress yet is known not to checkpoint, so the core pins it."""
    c = cluster(gpus_per_node=1)
    job = c.submit(emu("bert_train2", 2.0, "--no-checkpoint"), name="nock")
    assert c.controller.wait_all(60), c.controller.status()
    rec = {r.id: r for r in c.controller.store.jobs()}[job]
    assert rec.checkpointable is False and rec.state == "finished"
    assert c.controller.loop.state.jobs[job].spec.checkpointable is False  # the core knows


def test_checkpointable__known_per_job_and_silent_jobs_are_not_waited_for(cluster) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    for a in c.transport.agents().values():
        a.no_helper_after = 1.0
    helper = c.submit(emu("bert_train2", 2.0), name="helper")
    silent = c.submit(["sleep", "4"], name="silent")
    assert ctl.wait_all(60), ctl.status()
    recs = {r.id: r for r in ctl.store.jobs()}
    assert recs[helper].checkpointable is True and recs[silent].checkpointable is False
    st = {x["id"]: x for x in ctl.status()["jobs"]}
    assert st[silent]["checkpointable"] is False
    prof = ctl.store.events("decision:StartProfiling")
    if any(silent in e["body"]["jobs"] for e in prof):
        assert recs[silent].note == "not profiled: no progress reports"


# ---- 9/10. cluster-side bad inputs ----------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_down__does_not_signal_a_pid_that_is_not_our_head(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "cluster.json").write_text(json.dumps({"pid": bystander.pid,
                                                           "address": "127.0.0.1:1"}))
        r = runner.invoke(app, ["cluster", "down", "--state-dir", str(tmp_path)])
        assert r.exit_code == 0 and "stale" in r.output
        assert _pid_alive(bystander.pid) and not (tmp_path / "cluster.json").exists()
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("args, words", [
    (["submit", "--memory-gb", "nan", "--", "true"], "--memory-gb"),
    (["submit", "--memory-gb", "-3", "--", "true"], "--memory-gb"),
    (["submit", "--env", "NOEQUALS", "--", "true"], "expected NAME=VALUE"),
    (["status", "--address", "127.0.0.1:1"], "127.0.0.1:1"),
    (["cluster", "up", "--emulated", "--policy", "bogus"], "unknown policy 'bogus'"),
    (["cluster", "up", "--emulated", "--estimator", "bogus"], "unknown estimator 'bogus'"),
    (["cluster", "up", "--emulated", "--profile-seconds", "nan"], "--profile-seconds must"),
    (["logs", "--tail", "0", "j0001"], "--tail"),
    (["logs", "--tail", "-5", "j0001"], "--tail"),
])
def test_cli__cluster_side_bad_inputs_are_one_line_errors(tmp_path: Path, args: list[str],
                                                         words: str) -> None:
    from miso.cli import app as miso_app

    at = 2 if args[0] == "cluster" else 1
    t0 = time.time()
    r = runner.invoke(miso_app, [*args[:at], "--state-dir", str(tmp_path), *args[at:]])
    assert time.time() - t0 < 10
    assert r.exit_code != 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], r.output
    assert "Traceback" not in r.output


def test_status__unreachable_url_gives_up_and_honours_sigterm(tmp_path: Path) -> None:
    """A refused connection is a one-line error at once; a server that accepts and never
    answers leaves ``miso status`` waiting, and SIGTERM ends that wait."""
    env = {**os.environ, "PYTHONPATH": str(Path(jobhelper.__file__).parents[1])}
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        closed = free.getsockname()[1]
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "miso.cli", "status", "--url",
                        f"http://127.0.0.1:{closed}", "--token", "t", "--state-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode != 0 and time.time() - t0 < 10
    assert p.stderr.strip().count("\n") == 0 and f"127.0.0.1:{closed}" in p.stderr, p.stderr
    with socket.socket() as silent:   # accepts (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        q = subprocess.Popen([sys.executable, "-m", "miso.cli", "status", "--url",
                              f"http://127.0.0.1:{port}", "--token", "t", "--state-dir",
                              str(tmp_path)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: q.poll() is not None or _connected(silent), timeout=20)
            assert q.poll() is None, "status should still be waiting on the silent server"
            q.send_signal(signal.SIGTERM)
            assert q.wait(timeout=10) != 0
        finally:
            if q.poll() is None:
                q.kill()
                q.wait()
            while _held:
                _held.pop().close()


def _connected(server: socket.socket) -> bool:
    """True once a client connection is queued on ``server`` (non-blocking accept)."""
    server.setblocking(False)
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    _held.append(conn)   # keep it open: the client waits for an answer
    return True


_held: list[socket.socket] = []


def test_lock__held_state_dir_refused_by_up_naming_the_pid(tmp_path: Path) -> None:
    lock = StateDirLock(tmp_path).acquire()
    try:
        r = runner.invoke(app, ["cluster", "up", "--emulated", "--state-dir", str(tmp_path)])
        assert r.exit_code != 0 and f"PID {os.getpid()}" in r.output, r.output
    finally:
        lock.release()


def test_up__damaged_store_is_refused_before_starting_anything(tmp_path: Path) -> None:
    open_store(tmp_path).close()
    (tmp_path / "miso.db").write_bytes(b"")
    r = runner.invoke(app, ["cluster", "up", "--emulated", "--state-dir", str(tmp_path)])
    assert r.exit_code != 0 and "is empty" in r.output and len(r.output.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.ray
def test_cluster__down_stops_jobs_without_the_helper_and_a_second_up_is_refused(
        tmp_path: Path) -> None:
    sd = str(tmp_path / "state")
    mark = f"down-{os.getpid()}-{time.time()}"
    r = runner.invoke(app, ["cluster", "up", "--emulated", "--gpus", "1", "--state-dir", sd,
                            "--profile-seconds", "0.3"])
    assert r.exit_code == 0, r.output
    try:
        r = runner.invoke(app, ["cluster", "up", "--emulated", "--state-dir", sd])
        assert r.exit_code != 0 and "already runs" in r.output, r.output
        r = runner.invoke(app, ["submit", "--state-dir", sd, "--env", f"MISO_TEST_MARK={mark}",
                                "--", "sleep", "300"])
        assert r.exit_code == 0, r.output
        wait_for(lambda: running_copies(mark), 60)
    finally:
        import ray

        ray.shutdown()
        r = runner.invoke(app, ["cluster", "down", "--state-dir", sd])
    assert r.exit_code == 0, r.output
    wait_for(lambda: not pids_with_env("MISO_TEST_MARK", mark), 20)  # no orphan (PPID 1)


@pytest.mark.slow
def test_readme__pytorch_job_checkpoints_and_resumes_under_an_agent(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    assert torch
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = readme.split("# train.py\n", 1)[1].split("```", 1)[0]
    code = code.replace(".cuda()", "").replace('device="cuda"', 'device="cpu"')
    script = tmp_path / "train.py"
    script.write_text(code.replace("10_000", "4_000"))
    a = Agent("n0", EmulatedBackend(1), tmp_path / "agent")
    try:
        a.apply_layout(0, [[0, "7g.40gb"]])
        ck = tmp_path / "ck"
        spec = {"job": "t", "command": [sys.executable, str(script)], "gpu": 0,
                "placement": [0, "7g.40gb"], "checkpoint_dir": str(ck),
                "env": {"PYTHONPATH": str(Path(jobhelper.__file__).parents[1])}}
        assert a.launch({**spec, "attempt": 1})["ok"]

        def rep(n: int) -> dict[str, Any]:
            return next(x for x in a.report()["jobs"] if x["attempt"] == n)

        wait_for(lambda: (rep(1)["iteration"] or 0) > 50, 180)
        assert rep(1)["checkpointable"] is True
        assert a.checkpoint("t", 1)
        r1 = wait_for(lambda: (x := rep(1))["status"] != "running" and x, 120)
        assert r1["status"] == "checkpointed", a.logs("t")
        saved = r1["checkpoint_iteration"]
        assert saved and saved > 50 and Path(r1["checkpoint_path"]).exists()
        assert a.launch({**spec, "attempt": 2, "resume_from": r1["checkpoint_path"]})["ok"]
        r2 = wait_for(lambda: (x := rep(2))["status"] != "running" and x, 240)
        assert r2["status"] == "finished", a.logs("t")
        assert r2["start_iteration"] == saved and r2["iteration"] == 4000
    finally:
        a.shutdown()


def test_recovery__a_restored_store_never_reuses_attempt_numbers(cluster) -> None:  # noqa: ANN001
    c = cluster(gpus_per_node=1)
    ctl = c.controller
    j = c.submit(emu("bert_train2", 3.0, "--checkpoint-every", "0.3"))
    wait_for(lambda: (ctl.store.get(j).checkpoint_iteration or 0) > 5, 40)
    c.crash_controller()
    db = sqlite3.connect(c.dir / "miso.db")  # as restored from a backup taken at submission
    db.execute("UPDATE jobs SET attempts=0, state='queued', checkpoint_iteration=NULL, "
               "checkpoint_path=NULL")
    db.execute("DELETE FROM attempts")
    db.commit()
    db.close()
    ctl = c.start_controller()
    assert ctl.wait_all(60), ctl.status()
    rec = ctl.store.get(j)
    assert rec.state == "finished", rec.reason
    used = sorted(int(p.name.split("-")[1]) for p in
                  (c.dir / "agents" / "node0" / "jobs" / j).glob("attempt-*"))
    assert len(used) == len(set(used)) and min(a["attempt"] for a in ctl.store.attempts(j)) > 1
