"""Issue 26, item 1 on running clusters: no directory a root process of miso uses (Ray's temp
root and sessions from the Ray processes' command lines, the state dir, the checkpoint and
agent roots) is writable by a job's Unix account; a job of a mapped user sees its process
bound below pid_max and a memory bound. Three paths: ``miso cluster up --emulated`` (about
60-90 s), a real Slurm allocation of ``deploy/slurm/miso.sbatch`` (about 60-120 s) and the
systemd head unit's command with the dirs systemd would make (RuntimeDirectory 0700,
StateDirectory 0711, UMask 0077; about 60-90 s). Root only (real accounts)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from accounts import unix_account
from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "security" / "paths_check.py"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="creates a Unix account")


def paths_check() -> Any:
    return load_script("miso_paths_check", CHECK)


def assert_private(res: dict[str, Any]) -> None:
    print(json.dumps(res))  # shown on failure: every field, not pytest's shortened repr
    assert not res.get("error"), res
    assert res["ray_dirs"], res  # the audit saw Ray's dirs
    assert res["writable_by_account_modebits"] == [], res
    assert res["writable_by_account_test_w"] == [], res
    assert res["job_state"] == "finished", res
    assert res["process_bound_below_pid_max"] and res["memory_bound"], res
    assert res["ok"], res


@pytest.mark.slow
@pytest.mark.ray
@ROOT_ONLY
def test_no_root_path_of_a_running_cluster_is_writable_by_a_jobs_account() -> None:
    r = subprocess.run([sys.executable, str(CHECK)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.stdout.strip(), r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert_private(res)
    assert r.returncode == 0, res


def _shared_state_dir(mode: int = 0o755) -> Path:
    """A state dir jobs' accounts can traverse to their own dirs (as on a shared FS)."""
    sd = Path(tempfile.mkdtemp(prefix="miso-pa-"))
    os.chmod(sd, mode)
    return sd


@pytest.mark.slow
@pytest.mark.ray
@ROOT_ONLY
def test_slurm_allocation__no_root_path_is_writable_by_a_jobs_account() -> None:
    """A real Slurm allocation (Debian's slurm-wlm, count-only GPUs) of deploy/slurm/
    miso.sbatch: Ray's dirs under ``/tmp/miso-slurm-<job>-<hex>``, the state dir and its
    roots; then scancel."""
    from slurmlab import SlurmLab, missing

    if missing():
        pytest.skip(missing() or "")
    pc = paths_check()
    sd = _shared_state_dir()
    res: dict[str, Any] = {}
    try:
        with SlurmLab(gpus=2) as lab, unix_account("misopa") as acct:
            out = sd.parent / f"{sd.name}.out"
            env = {"MISO_STATE_DIR": str(sd), "MISO": f"{sys.executable} -m miso.cli",
                   "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT / "src")}
            r = lab.run(["sbatch", "--parsable", f"--gres=gpu:{lab.gpus}", f"--output={out}",
                         str(ROOT / "deploy" / "slurm" / "miso.sbatch"), "--emulated",
                         "--gpus", "2", "--profile-seconds", "0.5"], env=env)
            assert r.returncode == 0, r.stderr
            job = r.stdout.strip().split(";")[0]
            deadline = time.time() + 240
            while time.time() < deadline:
                try:
                    state = json.loads((sd / "slurm.json").read_text())
                except (OSError, ValueError):
                    state = {}
                if state.get("job_id") == int(job) and state.get("api_url"):
                    break
                assert lab.job_state(job) in ("PENDING", "RUNNING", "CONFIGURING"), \
                    f"the allocation ended:\n{out.read_text() if out.exists() else ''}"
                time.sleep(0.5)
            try:
                pc.audit(sd, acct, f"miso-slurm-{job}-", res)
            finally:
                lab.run(["scancel", job])
                deadline = time.time() + lab.kill_wait + 30
                while time.time() < deadline and lab.job_state(job):
                    time.sleep(0.5)
            out.unlink(missing_ok=True)
    finally:
        shutil.rmtree(sd, ignore_errors=True)
    assert all(f"/tmp/miso-slurm-{job}-" in d for d in res.get("ray_dirs", [])), res
    assert_private(pc.verdict(res))


@pytest.mark.slow
@pytest.mark.ray
@ROOT_ONLY
def test_systemd_head_unit__no_root_path_is_writable_by_a_jobs_account() -> None:
    """The head unit's ExecStart (deploy/systemd/miso-head.service, here with an emulated
    agent and loopback ports) with what systemd makes first: ``RuntimeDirectory`` under /run
    mode 0700, ``StateDirectory`` under /var/lib mode 0711, ``UMask=0077``. No systemd runs
    here: the dirs are made as its exec.c does (mkdir, chmod, root-owned)."""
    from miso.deploy import node as nd
    from miso.deploy import slurm

    pc = paths_check()
    mark = uuid.uuid4().hex[:8]
    rt = Path(f"/run/miso-pa-{mark}")        # RuntimeDirectory=miso, RuntimeDirectoryMode=0700
    sd = Path(f"/var/lib/miso-pa-{mark}")    # StateDirectory=miso, StateDirectoryMode=0711
    for d, mode in ((rt, 0o700), (sd, 0o711)):
        d.mkdir()
        os.chmod(d, mode)
    ports = slurm.choose_ports(int(mark, 16), nd.port_free)
    sock = rt.parent / f"miso-pa-{mark}.notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(sock))
    notify.settimeout(180)
    res: dict[str, Any] = {}
    p = subprocess.Popen(
        [sys.executable, "-m", "miso.cli", "node", "--head", "--ports-block", str(ports.block),
         "--node-ip", "127.0.0.1", "--controller", "--state-dir", str(sd), "--temp-dir",
         str(rt / "ray"), "--grace", "15", "--", "--emulated", "--gpus", "2",
         "--profile-seconds", "0.5"],
        env={**os.environ, "NOTIFY_SOCKET": str(sock), "MISO_STATE_DIR": str(sd),
             "RAY_USAGE_STATS_ENABLED": "0"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, preexec_fn=lambda: os.umask(0o077))
    try:
        with unix_account("misopa") as acct:
            assert notify.recv(64) == b"READY=1"
            try:
                pc.audit(sd, acct, str(rt), res, extra_roots=(str(rt),))
            finally:
                p.send_signal(signal.SIGTERM)  # systemctl stop (KillMode=mixed)
                p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        notify.close()
        sock.unlink(missing_ok=True)
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(sd, ignore_errors=True)
    assert all(d.startswith(str(rt)) for d in res.get("ray_dirs", [])), res
    assert_private(pc.verdict(res))
