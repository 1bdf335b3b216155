"""Files a job writes are hostile input to the agent: whatever one job puts in its progress
file, checkpoint record or log, the node's poll never raises, that job's reports are marked
invalid, and the other jobs on the node run to their end (property-based, real processes)."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import VICTIM
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from waiting import wait_for

from miso.agent import Agent
from miso.backend import EmulatedBackend
from miso.job import LAST_CHECKPOINT, last_checkpoint

FIELDS = ["time", "iteration", "total", "start_iteration", "helper", "checkpointable", "done",
          "checkpoint"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
progress_like = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8) | \
    st.fixed_dictionaries({"time": json_values, "iteration": json_values,
                           "total": json_values, "helper": json_values})
contents = st.binary(max_size=3000) | json_values.map(lambda v: json.dumps(v).encode()) | \
    progress_like.map(lambda v: json.dumps(v).encode())

@pytest.fixture
def state() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="miso-files-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def launch(agent: Agent, state: Path, job: str, command: list[str], gpu_slot: list) -> dict:
    r = agent.launch({"job": job, "attempt": 1, "command": command, "gpu": 0,
                      "placement": gpu_slot, "mps_pct": None,
                      "checkpoint_dir": str(state / "ck" / job), "resume_from": None,
                      "env": {}, "cwd": str(state)})
    assert r["ok"], r
    return r


def put(path: Path, data: bytes) -> None:
    """Replace ``path`` with a regular file holding ``data`` (as a job would)."""
    tmp = path.with_name(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def well_typed(a: dict) -> None:
    """A report's job-derived fields are what the controller expects, whatever the file."""
    for k in ("iteration", "total", "time", "start_iteration", "checkpoint_iteration"):
        v = a[k]
        assert v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and
                             math.isfinite(v)), (k, v)
    assert a["checkpoint_path"] is None or isinstance(a["checkpoint_path"], str)
    assert a["checkpointable"] in (None, True, False)
    assert isinstance(a["report_error"], str)


def test_no_job_file_stops_the_poll_or_another_job(state: Path) -> None:
    from miso.agent import reports

    agent = Agent("node0", EmulatedBackend(1, "A100-40GB"), state / "agent")
    slots = [[0, "3g.20gb"], [4, "2g.10gb"], [6, "1g.5gb"]]
    assert agent.apply_layout(0, slots)["ok"]
    script = state / "victim.py"
    script.write_text(VICTIM)
    launch(agent, state, "hostile", ["/bin/sh", "-c", "sleep 60"], slots[0])
    for i, slot in enumerate(slots[1:]):
        launch(agent, state, f"victim{i}", [sys.executable, str(script)], slot)
    progress = state / "agent" / "jobs" / "hostile" / "attempt-1" / "job" / "progress.json"
    seen_victims: dict[str, dict] = {}

    def poll() -> dict:
        rep = agent.report()  # must never raise
        for a in rep["jobs"]:
            well_typed(a)
            if a["job"].startswith("victim"):
                assert a["report_error"] == "", a
                seen_victims[a["job"]] = a
        hostile = next(a for a in rep["jobs"] if a["job"] == "hostile")
        assert hostile["status"] == "running"
        return hostile

    @settings(max_examples=80, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(contents)
    @example(b'{"time": "x", "iteration": 1, "total": 10, "helper": true}')
    @example(b'{"time": [1], "iteration": 1}')
    @example(b'{"time": NaN, "iteration": Infinity}')
    @example(b'{"time": 1, "iteration": ' + b"9" * 4000 + b"}")
    @example(b"[" * 100000 + b"]" * 100000)
    @example(b'{"checkpoint": {"iteration": 1, "path": "a\\u0000b"}, "helper": 1}')
    @example(b"\xff\xfe{}")
    def fuzz(data: bytes) -> None:
        put(progress, data)
        hostile = poll()
        try:
            reports.check_progress(json.loads(data))
            valid = True
        except (ValueError, RecursionError):  # BadReport is a ValueError
            valid = False
        assert (hostile["report_error"] == "") == (valid and len(data) <= 1 << 20), \
            (data[:200], hostile["report_error"])

    fuzz()
    # not a regular file: a FIFO, a symlink to an endless device, a directory, a huge file
    for make in (lambda p: os.mkfifo(p), lambda p: os.symlink("/dev/zero", p),
                 lambda p: os.mkdir(p), lambda p: p.write_bytes(b" " * (2 << 20) + b"{}")):
        if progress.is_dir() and not progress.is_symlink():
            progress.rmdir()
        else:
            progress.unlink(missing_ok=True)
        make(progress)
        assert poll()["report_error"].startswith("invalid progress file")
    # meanwhile the other jobs ran to their end, reported in full
    wait_for(lambda: all(a["status"] != "running" for a in agent.report()["jobs"]
                         if a["job"].startswith("victim")))
    poll()
    assert sorted(seen_victims) == ["victim0", "victim1"]
    for a in seen_victims.values():
        assert (a["status"], a["iteration"], a["total"]) == ("finished", 40, 40), a
    agent.shutdown()


@settings(max_examples=60, deadline=None, database=None)
@given(contents)
@example(b'{"path": "/x\\u0000y", "iteration": 3}')
@example(b'{"path": "/x", "iteration": "3"}')
def test_a_checkpoint_record_is_a_valid_record_or_none(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / ".miso").mkdir()
        (Path(d) / ".miso" / LAST_CHECKPOINT).write_bytes(data)
        rec = last_checkpoint(d)  # never raises
        if rec is not None:
            assert isinstance(rec["path"], str) and "\0" not in rec["path"]
            Path(rec["path"]).exists()  # what the controller does next: must not raise
            it = rec.get("iteration")
            assert it is None or (type(it) is int and it >= 0)


@settings(max_examples=60, deadline=None, database=None)
@given(st.binary(max_size=5000), st.integers(1, 50))
def test_any_log_bytes_read_back(data: bytes, n: int) -> None:
    from miso.agent.logfile import tail_lines

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "output.log"
        f.write_bytes(data)
        lines = tail_lines(f, n)
        assert len(lines) <= n
        want = data.decode(errors="replace").splitlines()[-n:]
        assert lines == [ln.rstrip() if ln.startswith("[miso: ") else ln for ln in want]


HOSTILE = textwrap.dedent("""\
    import json, os, time
    for _ in range(30):
        with open(os.environ["MISO_PROGRESS_FILE"] + ".tmp", "w") as f:
            json.dump({"time": "x", "iteration": 1, "total": 10, "helper": True}, f)
        os.replace(os.environ["MISO_PROGRESS_FILE"] + ".tmp", os.environ["MISO_PROGRESS_FILE"])
        time.sleep(0.1)
""")


def test_a_bad_progress_file_is_shown_and_blinds_nothing(tmp_path: Path) -> None:
    from miso.cluster.local import LocalCluster
    from miso.controller import ControllerConfig

    # NoPart: no repartition restarts a job here, so every job must run exactly once (under
    # miso+ the third job may share the first one's GPU and restart it: a policy choice, not
    # what this test is about)
    cfg = ControllerConfig(policy="nopart", profile_seconds_per_level=0.3,
                           profile_warmup_s=0.15, checkpoint_timeout=3.0, poll_interval=0.1,
                           lease_s=2.0)
    c = LocalCluster(tmp_path / "c", config=cfg, rate_window=0.5, gpus_per_node=2)
    try:
        ctl = c.controller
        assert ctl is not None
        bad = c.submit([sys.executable, "-c", HOSTILE], memory_gb=1.0)
        good = c.submit([sys.executable, "-c", VICTIM], memory_gb=1.0)
        quick = c.submit(["/bin/true"], memory_gb=1.0)
        note = wait_for(lambda: next((j["why"] for j in ctl.status()["jobs"]
                                      if j["id"] == bad and j["state"] != "queued" and
                                      j["why"]), None))
        assert note.startswith("reports invalid: invalid progress file: 'time'"), note
        assert ctl.wait_all(60)
        for j in (bad, good, quick):
            rec = ctl.store.get(j)
            assert (rec.state, rec.attempts) == ("finished", 1), rec
    finally:
        c.close()


def test_a_job_that_finishes_while_a_move_waits_is_not_run_again(tmp_path: Path) -> None:
    """A move (launch on another GPU) that waits for the job's old copy to stop must not start
    the job again when that copy *finished* it (seen by the security benchmark: a victim ran a
    second time)."""
    import threading

    from miso.cluster.local import LocalCluster
    from miso.controller import ControllerConfig
    from miso.mig import Placement

    cfg = ControllerConfig(profile_seconds_per_level=0.3, profile_warmup_s=0.15,
                           checkpoint_timeout=3.0, poll_interval=0.1, lease_s=2.0)
    c = LocalCluster(tmp_path / "c", config=cfg, rate_window=0.5, gpus_per_node=2)
    try:
        ctl = c.controller
        assert ctl is not None
        flag = tmp_path / "go"
        j = c.submit(["/bin/sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done"],
                     memory_gb=1.0)
        run = wait_for(lambda: ctl.rt.runs.get(j))
        other = next(g for g in ctl.rt.gpus if g != run.gpu)
        agent = c.transport.agents()["node0"]
        idx = ctl.rt.gpus[other].index
        assert agent.apply_layout(idx, [[0, "7g.40gb"]])["ok"]
        box: list = []

        def move() -> None:
            try:
                box.append(ctl.executor.launcher.launch(j, other, Placement(0, "7g.40gb"), None))
            except Exception as e:  # noqa: BLE001 - shown by the assertion
                box.append(e)

        t = threading.Thread(target=move)
        t.start()
        flag.touch()  # the old copy finishes the job while the move waits for it
        t.join(30)
        assert box == [None]
        assert ctl.wait_all(20)
        assert [a["status"] for a in ctl.store.attempts(j)] == ["finished"]
    finally:
        c.close()
