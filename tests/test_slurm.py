"""miso inside a real Slurm allocation (Debian's slurm-wlm on this machine, count-only GPUs):
deploy/slurm/miso.sbatch brings up Ray, the controller and the API; emulated jobs run; a plain
``scancel`` ends the allocation with every job saved and no process left; the next allocation
on the same state directory resumes them; an orderly stop (the time-limit signal,
``scancel --batch --signal=TERM``) has every job save through the controller. Slow: about
2-3 minutes. Skips when the Slurm binaries are missing or not root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from slurmlab import SlurmLab, missing, processes_of_job

pytestmark = [pytest.mark.slow, pytest.mark.ray]
if missing():
    pytest.skip(missing() or "", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
SBATCH = ROOT / "deploy" / "slurm" / "miso.sbatch"


@pytest.fixture(scope="module")
def lab() -> Any:
    with SlurmLab(gpus=4) as lab:
        yield lab


def miso(sd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "miso.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "MISO_STATE_DIR": str(sd)})


def start_allocation(lab: SlurmLab, sd: Path, out: Path) -> str:
    env = {"MISO_STATE_DIR": str(sd), "MISO": f"{sys.executable} -m miso.cli",
           "RAY_USAGE_STATS_ENABLED": "0"}
    r = lab.run(["sbatch", "--parsable", f"--gres=gpu:{lab.gpus}", f"--output={out}",
                 str(SBATCH), "--emulated", "--gpus", "4", "--profile-seconds", "0.5"],
                env=env)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    deadline = time.time() + 240
    while time.time() < deadline:
        state = read_state(sd)
        if state.get("job_id") == int(job) and state.get("api_url"):
            return job
        assert lab.job_state(job) in ("PENDING", "RUNNING", "CONFIGURING"), \
            f"the allocation ended before miso came up:\n{out.read_text()}\n{lab.logs()}"
        time.sleep(0.5)
    raise AssertionError(f"miso did not come up:\n{out.read_text()}")


def read_state(sd: Path) -> dict[str, Any]:
    try:
        return json.loads((sd / "slurm.json").read_text())
    except (OSError, ValueError):
        return {}


def jobs(sd: Path) -> dict[str, dict[str, Any]]:
    r = miso(sd, "status", "--json")
    assert r.returncode == 0, r.stderr
    return {j["name"]: j for j in json.loads(r.stdout)["jobs"]}


def wait_jobs(sd: Path, pred: Any, timeout: float = 120) -> dict[str, dict[str, Any]]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        js = jobs(sd)
        if pred(js):
            return js
        time.sleep(0.5)
    raise AssertionError(f"jobs never got there: {jobs(sd)}")


def end_allocation(lab: SlurmLab, job: str, out: Path, *scancel: str) -> float:
    """scancel the allocation; wait until it left the queue and nothing of it runs."""
    t0 = time.time()
    r = lab.run(["scancel", *scancel, job])
    assert r.returncode == 0, r.stderr
    deadline = t0 + lab.kill_wait + 30
    while time.time() < deadline and (lab.job_state(job) or processes_of_job(job)):
        time.sleep(0.2)
    assert lab.job_state(job) == "", out.read_text()
    assert processes_of_job(job) == [], out.read_text()
    assert not list(Path("/tmp").glob(f"miso-slurm-{job}-*"))  # noqa: S108 - the node's Ray temp dir
    return time.time() - t0


EMU = [sys.executable, "-m", "miso.emuworkload", "--ips", "40"]


def test_slurm_allocation__scancel_saves_every_job_and_leaves_nothing(
        lab: SlurmLab, tmp_path: Path) -> None:
    sd = tmp_path / "state"
    out1 = tmp_path / "alloc1.out"
    job1 = start_allocation(lab, sd, out1)
    state = read_state(sd)
    assert state["ports"]["gcs"] == int(state["address"].rsplit(":", 1)[1])
    for i in range(3):
        r = miso(sd, "submit", "--name", f"long{i}", "--memory-gb", "4", "--", *EMU,
                 "--workload", "resnet_train128", "--iterations", "100000")
        assert r.returncode == 0, r.stderr
    r = miso(sd, "submit", "--name", "short", "--memory-gb", "4", "--", *EMU,
             "--workload", "bert_train2", "--iterations", "40")
    assert r.returncode == 0, r.stderr
    before = wait_jobs(sd, lambda js: js.get("short", {}).get("state") == "finished" and all(
        js.get(f"long{i}", {}).get("state") == "running" and
        (js[f"long{i}"].get("iteration") or 0) > 100 for i in range(3)))

    # 1. plain scancel: SIGTERM to every process at once, then SIGKILL after KillWait
    end_allocation(lab, job1, out1)
    # 2. the next allocation on the same state directory resumes every job from the save it
    #    made on that SIGTERM (past where it was before the cancel)
    out2 = tmp_path / "alloc2.out"
    job2 = start_allocation(lab, sd, out2)
    assert job2 != job1
    after = wait_jobs(sd, lambda js: all(js[f"long{i}"]["state"] == "running"
                                         for i in range(3)))
    assert after["short"]["state"] == "finished"
    for i in range(3):
        name = f"long{i}"
        assert (after[name]["checkpoint_iteration"] or 0) >= before[name]["iteration"], \
            (name, before[name], after[name])
    # 3. the orderly stop (what `#SBATCH --signal=B:TERM@120` sends before the time limit):
    #    every running job saves through the agents and exits 75
    running = wait_jobs(sd, lambda js: all((js[f"long{i}"].get("iteration") or 0) >
                                           (after[f"long{i}"]["checkpoint_iteration"] or 0)
                                           for i in range(3)))
    end_allocation(lab, job2, out2, "--batch", "--signal=TERM")
    assert "every job saved and stopped" in out2.read_text(), out2.read_text()
    for i in range(3):
        jid = running[f"long{i}"]["id"]
        last = max((sd / "agents").glob(f"*/jobs/{jid}/attempt-*"),
                   key=lambda d: int(d.name.split("-")[1]))
        rec = json.loads((last / "exit.json").read_text())  # the guard's record of the end
        assert rec["returncode"] == 75, (jid, last, rec)
