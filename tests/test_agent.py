"""Agent: real job processes on emulated MIG devices, progress, checkpoint/resume, MPS, speed
changes; the job-side helper; the reference emulated workload."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import emu_iterations as emu
from waiting import wait_for

from miso.agent import Agent, RateTracker
from miso.backend import EmulatedBackend
from miso.emuworkload import mps_speed
from miso.job import EXIT_CHECKPOINTED, JobContext
from miso.workloads import workload


@pytest.fixture
def agent(tmp_path: Path):  # noqa: ANN201
    a = Agent("n0", EmulatedBackend(1), tmp_path / "agent", rate_window=0.6,
              change_threshold=0.25)
    yield a
    pids = a.running_pids()
    a.shutdown()
    for p in pids:  # no orphans
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)


def job_report(a: Agent, job: str, attempt: int = 1) -> dict[str, Any]:
    return next(j for j in a.report()["jobs"] if j["job"] == job and j["attempt"] == attempt)


def spec(job: str, cmd: list[str], pl: list[Any], tmp: Path, attempt: int = 1,
         **kw: Any) -> dict[str, Any]:
    return {"job": job, "attempt": attempt, "command": cmd, "gpu": 0, "placement": pl,
            "checkpoint_dir": str(tmp / "ckpt" / job), **kw}


def test_agent__runs_at_table_speed_and_finishes(agent: Agent, tmp_path: Path) -> None:
    agent.apply_layout(0, [[0, "3g.20gb"], [4, "3g.20gb"]])
    r = agent.launch(spec("a", emu("bert_train2", 40, 40.0), [0, "3g.20gb"], tmp_path))
    assert r["ok"]
    rep = wait_for(lambda: (x := job_report(agent, "a"))["status"] != "running" and x)
    assert rep["status"] == "finished" and rep["iteration"] == 40
    # bert_train2 on 3g: 0.6269 of full speed -> 40 iterations at 40 it/s take ~1.6 s
    assert rep["ended"] - rep["started"] > 1.2
    assert "MIG 3g.20gb" in agent.logs("a")


def test_agent__checkpoint_and_resume_lose_nothing(agent: Agent, tmp_path: Path) -> None:
    agent.apply_layout(0, [[0, "7g.40gb"]])
    agent.launch(spec("a", emu(iters=400), [0, "7g.40gb"], tmp_path))
    wait_for(lambda: (job_report(agent, "a")["iteration"] or 0) > 20)
    assert agent.checkpoint("a", 1)
    rep = wait_for(lambda: (x := job_report(agent, "a"))["status"] != "running" and x)
    assert rep["status"] == "checkpointed" and rep["returncode"] == EXIT_CHECKPOINTED
    saved = rep["checkpoint_iteration"]
    assert saved == rep["iteration"] > 20
    # the instance is free once the process is gone: reconfigure, then resume elsewhere
    assert agent.apply_layout(0, [[0, "4g.20gb"], [4, "3g.20gb"]])["ok"]
    agent.launch(spec("a", emu(iters=400), [4, "3g.20gb"], tmp_path, attempt=2,
                      resume_from=rep["checkpoint_path"]))
    rep2 = wait_for(lambda: (x := job_report(agent, "a", 2))["start_iteration"] is not None
                    and x)
    assert rep2["start_iteration"] == saved


def test_agent__reconfiguring_a_busy_instance_is_refused(agent: Agent, tmp_path: Path) -> None:
    agent.apply_layout(0, [[0, "7g.40gb"]])
    agent.launch(spec("a", emu(iters=10000), [0, "7g.40gb"], tmp_path))
    wait_for(lambda: job_report(agent, "a")["iteration"] is not None)
    res = agent.apply_layout(0, [[0, "3g.20gb"]])
    assert not res["ok"] and res["kind"] == "IN_USE"
    assert res["layout"] == [[0, "7g.40gb"]]


def test_agent__crash_at_start_reports_failure_with_reason(agent: Agent,
                                                          tmp_path: Path) -> None:
    agent.apply_layout(0, [[0, "7g.40gb"]])
    agent.launch(spec("a", emu("bert_train2", 10, 10, "--crash-at-start"), [0, "7g.40gb"],
                      tmp_path))
    rep = wait_for(lambda: (x := job_report(agent, "a"))["status"] != "running" and x)
    assert rep["status"] == "failed" and rep["returncode"] == 1
    assert "crashing at start" in rep["log_tail"]


def test_agent__unknown_command_is_an_error_not_an_exception(agent: Agent,
                                                             tmp_path: Path) -> None:
    agent.apply_layout(0, [[0, "7g.40gb"]])
    r = agent.launch(spec("a", ["/nonexistent/trainer"], [0, "7g.40gb"], tmp_path))
    assert not r["ok"] and "cannot start" in r["error"]
    r = agent.launch(spec("b", ["true"], [4, "3g.20gb"], tmp_path))  # no such instance
    assert not r["ok"]


def test_agent__job_without_helper_is_killed_on_checkpoint(agent: Agent,
                                                           tmp_path: Path) -> None:
    agent.no_helper_after = 0.2
    agent.apply_layout(0, [[0, "7g.40gb"]])
    agent.launch(spec("a", [sys.executable, "-c", "import time; time.sleep(60)"],
                      [0, "7g.40gb"], tmp_path))
    time.sleep(0.4)
    agent.checkpoint("a", 1)
    rep = wait_for(lambda: (x := job_report(agent, "a"))["status"] != "running" and x)
    assert rep["status"] == "killed"


def test_agent__mps_runs_set_pipe_and_share_and_slow_each_other(agent: Agent,
                                                               tmp_path: Path) -> None:
    agent.apply_layout(0, [[0, "7g.40gb"]])
    for j in ("a", "b"):
        agent.launch(spec(j, emu("resnet_train128", 100000, 40.0), [0, "7g.40gb"], tmp_path,
                          mps_pct=50))
    wait_for(lambda: all(x["steady_rate"] for x in agent.report()["jobs"]), 20)
    rates = [x["steady_rate"] for x in agent.report()["jobs"]]
    assert all(r < 40.0 for r in rates)  # shared GPU, MPS overhead
    log = agent.logs("a")
    assert "MPS 50%" in log
    pipe = next((tmp_path / "agent" / "mps").iterdir()) / "pipe"
    assert pipe.is_dir()


def test_agent__reports_a_phase_change(agent: Agent, tmp_path: Path) -> None:
    agent.apply_layout(0, [[0, "7g.40gb"]])
    agent.launch(spec("a", emu("resnet_train128", 240, 40.0, "--phase-at", "0.35",
                               "--phase-factor", "0.4"), [0, "7g.40gb"], tmp_path))
    rep = wait_for(lambda: (x := job_report(agent, "a"))["change_seq"] >= 1 and x, 20)
    observed, baseline = rep["change"]
    assert 0.25 < observed / baseline < 0.6


def test_rate_tracker__steady_then_change() -> None:
    rt = RateTracker(window=1.0, threshold=0.25, warmup=0.0)
    t, it = 0.0, 0.0
    for _ in range(30):
        t += 0.1
        it += 1.0  # 10 it/s
        rt.add(t, it)
    assert rt.steady == pytest.approx(10.0)
    assert rt.change_seq == 0
    for _ in range(40):
        t += 0.1
        it += 0.5  # 5 it/s
        rt.add(t, it)
    assert rt.change_seq == 1
    assert rt.change is not None and rt.change[0] == pytest.approx(5.0)
    assert rt.baseline == pytest.approx(5.0)


def test_job_helper__outside_miso_is_inert(tmp_path: Path) -> None:
    ctx = JobContext(env={}, install_signal=False)
    assert not ctx.managed and ctx.load() is None
    ctx.report(5, 10)
    assert ctx.save_json({"x": 1}, iteration=5) is None
    assert not ctx.checkpoint_requested()


def test_job_helper__flag_file_and_save(tmp_path: Path) -> None:
    env = {"MISO_PROGRESS_FILE": str(tmp_path / "p.json"),
           "MISO_CHECKPOINT_DIR": str(tmp_path / "ck"),
           "MISO_CHECKPOINT_FLAG": str(tmp_path / "flag")}
    ctx = JobContext(env=env, install_signal=False)
    ctx.started(3, 10)
    assert not ctx.checkpoint_requested()
    (tmp_path / "flag").touch()
    assert ctx.checkpoint_requested()
    path = ctx.save_json({"iteration": 7}, iteration=7)
    ctx2 = JobContext(env={**env, "MISO_RESUME_FROM": str(path)}, install_signal=False)
    assert ctx2.load() == {"iteration": 7}



def test_job_helper__the_framework_checkpoint_path_is_not_a_json_name(tmp_path: Path) -> None:
    """`torch.save(..., ctx.checkpoint_path)` must not write a file named `.json`; save_json
    keeps its own JSON file, so the two never overwrite each other."""
    env = {"MISO_PROGRESS_FILE": str(tmp_path / "p.json"),
           "MISO_CHECKPOINT_DIR": str(tmp_path / "ck")}
    ctx = JobContext(env=env, install_signal=False)
    assert ctx.checkpoint_path is not None
    assert not ctx.checkpoint_path.endswith(".json")
    assert Path(ctx.checkpoint_path).parent == tmp_path / "ck"
    saved = ctx.save_json({"x": 1}, iteration=1)
    assert saved is not None and saved.endswith(".json") and saved != ctx.checkpoint_path


def test_mps_speed__contention_lowers_speed() -> None:
    alone = mps_speed("resnet_train128", 100, [])
    crowded = mps_speed("resnet_train128", 100, [("bert_train2", 100.0)] * 3)
    assert 0 < crowded < alone <= 1.0
    assert mps_speed("bert_train2", 14, []) < mps_speed("bert_train2", 50, [])
    assert workload("bert_train2").speed(7) == 1.0


def test_rate_tracker_forgets_old_samples_after_a_second_sample_within_warmup() -> None:
    """An attempt sampled twice within its warm-up (a fake node advances every job at each
    launch of another) keeps a bounded window of samples once its steady rate is known, and
    its rates are those of the recent samples."""
    rt = RateTracker(window=1.0, threshold=0.25, warmup=0.2)
    rt.add(0.0, 0.0)
    rt.add(0.05, 0.5)  # within the warm-up of the first
    t, it = 0.05, 0.5
    for _ in range(600):  # 60 s at 10 it/s, sampled every 0.1 s
        t += 0.1
        it += 1.0
        rt.add(t, it)
    assert rt.steady == pytest.approx(10.0)
    assert len(rt.samples) <= 4 * 10 + 3  # four windows of samples, not the whole life
    assert rt.rate(1.0) == pytest.approx(10.0)
    assert rt.rate(4.0) == pytest.approx(10.0)
