"""Fencing by epoch (issue 26, item 2): a guard whose node has a newer agent generation ends
its job, and a new agent ends every leftover guard of its node before it launches anything -
even when the new agent keeps renewing the same lease file in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import emu
from waiting import wait_for

from miso.agent import Agent, generation, guard
from miso.backend import EmulatedBackend
from miso.nodewire import exit_record_path
from miso.transport.base import NodeUnavailable


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def test_guard__a_stale_generation_fences_its_job_though_the_lease_is_fresh(
        tmp_path: Path) -> None:
    gen = generation.bump(tmp_path)
    assert gen == 1 and generation.bump(tmp_path) == 2 and generation.bump(tmp_path) == 3
    lease = tmp_path / "lease"
    lease.write_text(f"{time.time() + 600:20.3f}\n")  # a fresh lease all along
    lease_fd = os.open(lease, os.O_RDONLY)
    gen_fd = generation.reader(tmp_path)
    record = tmp_path / "exit.json"
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", guard.__file__, "--lease-fd", str(lease_fd),
         "--generation-fd", str(gen_fd), "--generation", "3", "--exit-record", str(record),
         "--", "sleep", "60"], pass_fds=(lease_fd, gen_fd), start_new_session=True)
    try:
        time.sleep(0.5)
        assert proc.poll() is None  # its own generation: it runs
        generation.bump(tmp_path)    # a new agent took the node
        t0 = time.monotonic()
        assert proc.wait(timeout=5) == 137
        assert time.monotonic() - t0 < 2
        rec = json.loads(record.read_text())
        assert rec["fenced"] and rec["why"] == "agent replaced"
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(lease_fd)
        os.close(gen_fd)


def test_agent__a_new_agent_ends_the_old_ones_jobs_before_it_launches(tmp_path: Path) -> None:
    """The old agent (still alive, as after a head SIGKILL its actor outlives the head for a
    while) keeps renewing the shared lease; its job must end when the new agent starts."""
    wd = tmp_path / "agent"
    old = Agent("n0", EmulatedBackend(1), wd)
    new = None
    try:
        old.apply_layout(0, [[0, "3g.20gb"]])
        old.report(time.time() + 600)
        assert old.launch({"job": "j1", "attempt": 1, "command": emu("bert_train2", 600),
                           "gpu": 0, "placement": [0, "3g.20gb"]})["ok"]
        wait_for(lambda: old.running_pids(), 5)
        guard_pid = old.running_pids()[0]
        assert generation.leftover_guards(wd, old.generation) == []
        new = Agent("n0", EmulatedBackend(1), wd)   # returns once the old guard is gone
        assert new.generation == old.generation + 1
        assert not _alive(guard_pid)
        assert generation.leftover_guards(wd, new.generation) == []
        rec = json.loads(exit_record_path(wd, "j1", 1).read_text())
        assert rec["fenced"] and rec["why"] == "agent replaced"
        old.report(time.time() + 600)  # the old agent renewing changes nothing
        reps = wait_for(lambda: (r := old.report()["jobs"]) and r[0]["status"] != "running"
                        and r, 5)
        assert reps[0]["status"] == "fenced"
        with pytest.raises(NodeUnavailable, match="replaced"):  # the old life launches nothing
            old.launch({"job": "j2", "attempt": 1, "command": ["sleep", "60"], "gpu": 0,
                        "placement": [0, "3g.20gb"]})
    finally:
        old.shutdown()
        if new is not None:
            new.shutdown()


def _guard(tmp_path: Path, agent_pid: int, cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", guard.__file__, "--agent-pid", str(agent_pid),
         "--exit-record", str(tmp_path / "exit.json"), "--", *cmd], start_new_session=True)


def test_guard__a_guard_killed_outright_takes_its_jobs_main_process_with_it(
        tmp_path: Path) -> None:
    """Ray SIGKILLed every guard with its agent (issue 26, item 2): the jobs ran on, orphaned,
    beside the next cluster's attempts. A guard's job now dies with its guard."""
    proc = _guard(tmp_path, os.getpid(), ["sleep", "60"])
    try:
        wait_for(lambda: guard.descendants(proc.pid), timeout=5)
        job = guard.descendants(proc.pid)[0]
        proc.kill()
        proc.wait(timeout=5)
        wait_for(lambda: not _alive(job), timeout=3)
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in guard.descendants(proc.pid):
            os.kill(p, 9)


def test_guard__an_agent_left_a_zombie_is_dead_to_its_guards(tmp_path: Path) -> None:
    """An orphaned agent may stay a zombie for seconds: its guards fence at once."""
    agent = subprocess.Popen(["true"])  # exits; never reaped here: a zombie
    wait_for(lambda: not _alive(agent.pid), timeout=5)
    assert not guard.alive(agent.pid) and guard.alive(os.getpid())
    proc = _guard(tmp_path, agent.pid, ["sleep", "60"])
    try:
        assert proc.wait(timeout=5) == 137
        rec = json.loads((tmp_path / "exit.json").read_text())
        assert rec["fenced"] and rec["why"] == "agent died"
    finally:
        if proc.poll() is None:
            proc.kill()
        agent.wait()


def test_ray_processes_keep_the_children_of_a_dying_worker() -> None:
    """Every Ray miso starts (the local head here, ``ray start`` in deploy) is told not to
    SIGKILL a dead worker's children: the agent's guards must outlive it to end their jobs."""
    from miso import raycluster
    from miso.deploy.node import ray_env

    assert os.environ["RAY_kill_child_processes_on_worker_exit"] == "0"  # noqa: SIM112 - Ray's
    assert raycluster.RAY_ENV.items() <= ray_env({"PATH": "/bin"}).items()


def test_a_new_agent_ends_the_processes_of_a_job_whose_guard_is_gone(tmp_path: Path) -> None:
    """A guard killed outright leaves its job's other processes in the attempt's cgroup
    (``miso-<guard pid>``): the next agent of the node kills them before it launches."""
    home = guard.own_cgroup()
    dead = subprocess.Popen(["true"])
    dead.wait()  # a guard pid that is gone
    path = os.path.join(home or "/nonexistent", f"miso-{dead.pid}")
    try:
        os.mkdir(path)
    except OSError:
        pytest.skip("no writable cgroup v2 here")
    job = subprocess.Popen(["sleep", "60"])
    try:
        try:
            Path(path, "cgroup.procs").write_text(str(job.pid))
        except OSError:
            pytest.skip("cannot move a process into a cgroup here")
        generation.fence_leftovers(tmp_path, generation.bump(tmp_path))
        assert job.wait(timeout=3) == -9
        assert not os.path.isdir(path)
    finally:
        if job.poll() is None:
            job.kill()
        if os.path.isdir(path):
            os.rmdir(path)
