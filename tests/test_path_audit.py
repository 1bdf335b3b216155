"""Issue 26, item 1 on a running cluster: no directory a root process of miso uses (Ray's temp
root and sessions from the Ray processes' command lines, the state dir, the checkpoint and
agent roots) is writable by a job's Unix account; a job of a mapped user sees its process
bound below pid_max and a memory bound. Root only (real accounts); about 60-90 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(os.geteuid() != 0, reason="creates a Unix account")
def test_no_root_path_of_a_running_cluster_is_writable_by_a_jobs_account() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "security" / "paths_check.py")],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.stdout.strip(), r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert not res.get("error"), res
    assert res["ray_dirs"], res  # the audit saw Ray's dirs
    assert res["writable_by_account_modebits"] == [], res
    assert res["writable_by_account_test_w"] == [], res
    assert res["job_state"] == "finished", res
    assert res["process_bound_below_pid_max"] and res["memory_bound"], res
    assert res["ok"] and r.returncode == 0, res
