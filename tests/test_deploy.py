"""The deploy paths' pure parts and process handling, without Slurm: the ports of an
allocation, Ray's arguments, the node owner's reaping of orphans, a job saving on SIGTERM and
its guard letting it finish. (The real Slurm run is tests/test_slurm.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from waiting import wait_for

from miso.deploy import slurm

GUARD = Path(__file__).resolve().parent.parent / "src" / "miso" / "agent" / "guard.py"


# ---- ports ----------------------------------------------------------------------------------


@given(st.integers(0, 10**9), st.integers(0, 10**9))
def test_ports__two_allocations_with_different_blocks_share_no_port(a: int, b: int) -> None:
    pa = slurm.choose_ports(a, lambda _p: True)
    pb = slurm.choose_ports(b, lambda _p: True)
    span = set(range(pa.min_worker, pa.max_worker + 1)) | set(pa.named().values())
    other = set(range(pb.min_worker, pb.max_worker + 1)) | set(pb.named().values())
    assert all(1024 < p < 65536 for p in span)
    assert pa.block == a % slurm.BLOCKS
    if pa.block != pb.block:
        assert not span & other
    else:
        assert span == other


def test_ports__a_taken_port_moves_the_allocation_to_the_next_free_block() -> None:
    first = slurm.RayPorts.of_block(slurm.first_block(7))
    taken = {first.api, slurm.RayPorts.of_block(first.block + 1).gcs}
    chosen = slurm.choose_ports(7, lambda p: p not in taken)
    assert chosen.block == first.block + 2
    assert not taken & set(chosen.named().values())
    assert slurm.RayPorts.from_json(json.loads(json.dumps(chosen.to_json()))) == chosen


def test_ports__no_free_block_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no free block"):
        slurm.choose_ports(3, lambda _p: False)


@pytest.mark.parametrize("env, ok", [
    ({"SLURM_JOB_ID": "4242"}, 4242), ({"SLURM_JOBID": "17"}, 17),
    ({}, None), ({"SLURM_JOB_ID": "12; rm -rf /"}, None), ({"SLURM_JOB_ID": "-3"}, None),
])
def test_job_id__only_a_plain_number_inside_an_allocation(env: dict[str, str],
                                                          ok: int | None) -> None:
    if ok is None:
        with pytest.raises(ValueError):
            slurm.job_id_from_env(env)
    else:
        assert slurm.job_id_from_env(env) == ok


# ---- Ray's arguments ------------------------------------------------------------------------


def test_ray_args__head_and_worker_bind_only_the_allocations_ports() -> None:
    p = slurm.RayPorts.of_block(5)
    head = slurm.ray_start_args(p, head=True, temp_dir="/tmp/miso-slurm-5",
                                resources={"miso_agent": 1})
    assert f"--port={p.gcs}" in head and "--head" in head and "--block" in head
    assert "--include-dashboard=false" in head
    assert not any(a.startswith("--ray-client-server-port") for a in head)  # no ray[client]
    assert f"--ray-client-server-port={p.client}" in slurm.ray_start_args(
        p, head=True, ray_client=True)
    ported = [a for a in head if a.split("=")[0].endswith("port")]
    values = {int(a.split("=")[1]) for a in ported}
    assert values <= set(range(p.gcs, p.max_worker + 1)), ported
    assert '--resources={"miso_agent": 1}' in head
    worker = slurm.ray_start_args(p, head=False, address="10.0.0.1:20500",
                                  taken=lambda port: port == p.metrics)
    assert "--address=10.0.0.1:20500" in worker and "--head" not in worker
    assert not any(a.startswith("--metrics-export-port") for a in worker)
    with pytest.raises(ValueError):
        slurm.ray_start_args(p, head=False)


def test_srun_args__one_task_per_node_with_the_nodes_cpus_and_gpus() -> None:
    args = slurm.srun_node_args(["gpu01", "gpu02"], cpus_per_node=64, gpus_per_node=8)
    assert "--nodes=2" in args and "--ntasks=2" in args and "--ntasks-per-node=1" in args
    assert "--nodelist=gpu01,gpu02" in args and "--overlap" in args
    assert "--cpus-per-task=64" in args and "--gres=gpu:8" in args
    assert not any(a.startswith("--gres") for a in slurm.srun_node_args(["n"]))


# ---- the node owner reaps what escaped ------------------------------------------------------

ORPHAN = """
import subprocess, sys, time
from miso.deploy.node import become_subreaper, end_descendants
assert become_subreaper()
# a child that leaves a grandchild behind in its own session, deaf to SIGTERM
subprocess.run(["bash", "-c", "setsid bash -c 'trap \\"\\" TERM; echo $$; sleep 600' &"],
               stdout=open(sys.argv[1], "w"), check=True)
time.sleep(1.0)
killed = end_descendants(0.5)
print(len(killed))
"""


def test_node_owner__kills_orphans_that_left_its_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "orphan.pid"
    r = subprocess.run([sys.executable, "-c", ORPHAN, str(pid_file)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    orphan = int(pid_file.read_text().split()[0])
    assert int(r.stdout.split()[-1]) >= 1

    def gone() -> bool:
        try:
            os.kill(orphan, 0)
        except ProcessLookupError:
            return True
        return False
    wait_for(gone, 10)


# ---- a job saves on SIGTERM, its guard lets it finish ---------------------------------------

SAVER = """
import sys, time
from miso import job
ctx = job.context()
ctx.started(0, 100)
print("ready", flush=True)
deadline = time.time() + 30
while not ctx.checkpoint_requested() and time.time() < deadline:
    time.sleep(0.02)
time.sleep(1.0)                     # "saving" for a while, longer than the guard's poll
ctx.save_json({"it": 5}, iteration=5)
ctx.exit_checkpointed()
"""


def job_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "MISO_JOB_ID": "j1", "MISO_ATTEMPT": "1",
            "MISO_PROGRESS_FILE": str(tmp_path / "progress.json"),
            "MISO_CHECKPOINT_DIR": str(tmp_path)}


def test_job__a_managed_job_saves_on_sigterm_and_exits_75(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", SAVER], env=job_env(tmp_path),
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 75
    assert json.loads((tmp_path / "checkpoint.json").read_text()) == {"it": 5}


def test_guard__after_sigterm_the_agents_death_does_not_cut_a_save_short(
        tmp_path: Path) -> None:
    """The node is going away: Ray's worker (the agent) dies at once, the job is still
    saving. The guard lets it finish (the lease still bounds it) and records exit 75."""
    agent = subprocess.Popen(["sleep", "600"])
    lease = tmp_path / "lease"
    lease.write_text(str(time.time() + 60))
    record = tmp_path / "exit.json"
    env_file = tmp_path / "env.json"  # the job's environment reaches it through the guard's
    env_file.write_text(json.dumps(job_env(tmp_path)))  # file, as the agent passes it
    env_file.chmod(0o600)
    with open(lease) as lf:
        g = subprocess.Popen(
            [sys.executable, "-I", "-S", str(GUARD), "--lease-fd", str(lf.fileno()),
             "--agent-pid", str(agent.pid), "--exit-record", str(record),
             "--env-file", str(env_file), "--",
             sys.executable, "-c", SAVER], env={"PATH": os.environ.get("PATH", "")},
            pass_fds=(lf.fileno(),),
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert g.stdout is not None and g.stdout.readline().strip() == "ready"
        os.killpg(g.pid, signal.SIGTERM)  # Slurm/systemd: every process gets it
        agent.kill()
        agent.wait()
        assert g.wait(timeout=30) == 75
    rec = json.loads(record.read_text())
    assert rec["returncode"] == 75 and not rec["fenced"], rec


def test_cli__slurm_ports_prints_the_block_of_a_job_and_refuses_outside_an_allocation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from miso.cli import app

    r = CliRunner().invoke(app, ["slurm", "ports", "--job-id", "12345", "--no-check"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == slurm.RayPorts.of_block(12345 % slurm.BLOCKS).to_json()
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    r = CliRunner().invoke(app, ["slurm", "run", "--emulated"])
    assert r.exit_code == 2 and "not inside a Slurm allocation" in r.output


def test_head_address__loopback_alone_the_given_ip_else_refuses_a_loopback_name() -> None:
    from miso.deploy.slurmrun import head_address

    assert head_address("gpu01", 1) == "127.0.0.1"
    assert head_address("gpu01", 4, "10.1.2.3") == "10.1.2.3"
    with pytest.raises(RuntimeError, match="MISO_HEAD_IP"):
        head_address("localhost", 2)
