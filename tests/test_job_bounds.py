"""Issue 26, item 3: a job is bounded on its node (processes, host memory, disk); a job at a
bound is ended and reported as such (``limit``; ``over_limit`` in the store).

Run as root (as the CI does) these use real, throw-away Unix accounts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from accounts import unix_account
from waiting import wait_for

from miso.agent import Agent
from miso.agent.bounds import JobBounds, pid_max
from miso.backend import EmulatedBackend

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
USER_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
SMALL = JobBounds(max_procs=24, host_memory_gb=0.25, disk_gb=0.02, io_weight=100)


@pytest.fixture
def state() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="miso-bnd-"))  # under /tmp: jobs' accounts reach it
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_job(state: Path, code: str, acct: str, bounds: JobBounds = SMALL,
            timeout: float = 20) -> tuple[dict, str]:
    agent = Agent("node0", EmulatedBackend(1, "A100-40GB"), state / "agent", bounds=bounds)
    try:
        assert agent.apply_layout(0, [[0, "7g.40gb"]])["ok"]
        res = agent.launch({"job": "j", "attempt": 1, "command": [USER_PYTHON, "-c", code],
                            "gpu": 0, "placement": [0, "7g.40gb"], "mps_pct": None,
                            "checkpoint_dir": str(state / "ck" / "j"), "resume_from": None,
                            "env": {}, "cwd": "/", "owner": None, "unix_user": acct})
        assert res["ok"], res

        def ended() -> dict | None:
            rep = [a for a in agent.report()["jobs"] if a["job"] == "j"]
            return rep[0] if rep and rep[0]["status"] != "running" else None
        rep = wait_for(ended, timeout=timeout)
        return rep, agent.logs("j")
    finally:
        agent.shutdown()


def left_of(name: str) -> bool:
    return subprocess.run(["pgrep", "-u", name], capture_output=True).returncode == 0


FORK = textwrap.dedent("""\
    import os, time, resource
    print("nproc", resource.getrlimit(resource.RLIMIT_NPROC)[0], flush=True)
    n = 0
    for _ in range(400):
        try:
            if os.fork() == 0:
                time.sleep(60); os._exit(0)
            n += 1
        except OSError:
            time.sleep(0.01)
    print("forked", n, flush=True)
    time.sleep(60)
""")


@root_only
def test_a_job_forking_past_its_bound_is_stopped_and_reported(state: Path) -> None:
    assert SMALL.max_procs < pid_max()
    with unix_account() as acct:
        rep, log = run_job(state, FORK, acct.pw_name)
        assert rep["status"] == "limit", (rep, log)
        assert "processes" in rep["limit"], rep
        assert f"nproc {SMALL.max_procs}" in log, log  # bound before the drop, seen by the job
        wait_for(lambda: not left_of(acct.pw_name), timeout=5)


HOG = textwrap.dedent("""\
    import time
    keep = []
    for _ in range(64):
        keep.append(bytearray(32 << 20))   # touched: resident
        time.sleep(0.08)
    print("held", len(keep) * 32, "MiB", flush=True)
    time.sleep(60)
""")


@root_only
def test_a_memory_hog_is_stopped_and_reported(state: Path) -> None:
    with unix_account() as acct:
        rep, log = run_job(state, HOG, acct.pw_name)
        assert rep["status"] == "limit", (rep, log)  # ended by the sampler, or by the rlimit
        assert "host memory" in rep["limit"], rep  # ... seen at the bound: reported so
        assert "held 2048 MiB" not in log


FILL = textwrap.dedent("""\
    import os, time
    d = os.environ["MISO_CHECKPOINT_DIR"]
    with open(os.path.join(d, "fill"), "wb") as f:
        for i in range(200):
            f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno())
            time.sleep(0.01)
    print("wrote 200 MiB", flush=True)
    time.sleep(60)
""")


@root_only
def test_a_disk_filler_is_stopped_and_reported(state: Path) -> None:
    with unix_account() as acct:
        rep, log = run_job(state, FILL, acct.pw_name)
        assert rep["status"] == "limit", (rep, log)
        assert "disk" in rep["limit"], rep
        assert (state / "ck" / "j" / "fill").stat().st_size < 200 << 20


@root_only
def test_over_limit_is_a_distinct_end_state_in_the_store(
        state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the controller: the job's own --host-memory-gb reaches its guard, and a job
    ended for a bound is ``over_limit`` with the bound in its reason."""
    from miso.cluster.local import LocalCluster
    from miso.controller import ControllerConfig
    from miso.jobstatus import LIMIT_REASON, JobStatus

    monkeypatch.setenv("MISO_JOB_HOST_MEMORY_GB", "64")  # the node's default: not the bound
    with unix_account() as acct:
        c = LocalCluster(state / "state", config=ControllerConfig(poll_interval=0.1),
                         gpus_per_node=1)
        try:
            jid = c.submit([USER_PYTHON, "-c", HOG], memory_gb=1.0, owner=acct.pw_name,
                           unix_user=acct.pw_name, cwd="/tmp", host_memory_gb=0.25)
            ctl = c.controller
            assert ctl is not None
            rec = wait_for(lambda: (r := ctl.store.get(jid)).terminal and r, timeout=30)
        finally:
            c.close()
    assert rec.state == JobStatus.OVER_LIMIT, rec
    assert rec.reason.startswith(LIMIT_REASON + "host memory"), rec.reason
    assert rec.host_memory_gb == 0.25


def test_a_jobs_host_memory_request_replaces_the_node_default() -> None:
    args = JobBounds(max_procs=100, host_memory_gb=8, disk_gb=1).guard_args(["/x"], 0.5)
    assert args[args.index("--max-memory") + 1] == str(1 << 29)
    assert args[args.index("--max-procs") + 1] == "100"
    assert JobBounds.node_defaults().max_procs < pid_max()


def test_the_api_takes_a_strict_host_memory_request() -> None:
    from pydantic import ValidationError

    from miso.api.models import SubmitRequest

    assert SubmitRequest(command=["x"], host_memory_gb=2).host_memory_gb == 2
    for bad in ("2", True, 0, -1.0, 1e9):
        with pytest.raises(ValidationError):
            SubmitRequest(command=["x"], host_memory_gb=bad)
