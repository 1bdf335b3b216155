"""The cluster CLI commands, mounted as the main app will mount them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from miso.cli.client import cancel, logs, status, submit
from miso.cli.cluster import cluster_app
from miso.cli.demo import demo
from miso.cli.demo_cluster import demo_jobs, summarize

app = typer.Typer()
app.add_typer(cluster_app, name="cluster")
for _name, _fn in [("submit", submit), ("status", status), ("logs", logs), ("cancel", cancel),
                   ("demo", demo)]:
    app.command(_name)(_fn)
runner = CliRunner()


def test_cli__no_cluster_gives_a_clear_error(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("MISO_CONFIG", str(tmp_path / "no-config.json"))
    r = runner.invoke(app, ["submit", "--state-dir", str(tmp_path), "--", "true"])
    assert r.exit_code == 2 and "no miso cluster found" in r.output
    r = runner.invoke(app, ["cluster", "up", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "--emulated" in r.output
    r = runner.invoke(app, ["cluster", "up", "--emulated", "--gpu-model", "Z9",
                            "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "unknown GPU model" in r.output


def test_demo__stream_and_summary() -> None:
    jobs = demo_jobs(20, seed=1)
    assert len(jobs) == 20 and jobs[0][0] == 0.0 and jobs[-1][0] > jobs[0][0]
    assert all("miso.emuworkload" in c for _, _, c in jobs)
    s = summarize([
        {"state": "finished", "submitted_at": 0.0, "ended_at": 10.0, "restarts": 2},
        {"state": "finished", "submitted_at": 2.0, "ended_at": 6.0, "restarts": 0},
        {"state": "failed", "submitted_at": 3.0, "ended_at": 4.0, "restarts": 1},
    ])
    assert s == {"completed": 2, "failed": 1, "avg_jct_s": 7.0, "makespan_s": 10.0,
                 "restarts": 3, "restarts_per_job": 1.0}


def test_demo__in_process_json(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr("miso.cli.demo.demo_jobs",
                        lambda n, seed=0: [(0.3 * i, f"d{i}", [
                            sys.executable, "-m", "miso.emuworkload", "--workload",
                            "gnn_train64", "--iterations", "40", "--ips", "40"])
                            for i in range(n)])
    r = runner.invoke(app, ["demo", "--no-ray", "--gpus", "2", "--jobs", "3", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["completed"] == 3 and out["failed"] == 0
    assert set(out) == {"completed", "failed", "avg_jct_s", "makespan_s", "restarts",
                        "restarts_per_job"}


def test_demo__compare_runs_the_same_stream_under_both_policies(monkeypatch) -> None:  # noqa: ANN001
    """--compare runs the identical (seeded) stream under each policy and reports the ratio of
    their average JCTs; the stream itself is deterministic per seed."""
    assert demo_jobs(20, seed=3) == demo_jobs(20, seed=3)
    assert demo_jobs(20, seed=3) != demo_jobs(20, seed=4)
    seen: dict[str, object] = {}

    def fake_run(policy, stream, gpus, model, no_ray, timeout, out, args):  # noqa: ANN001, ANN202
        seen[policy] = list(stream)
        jct = {"miso+": 6.0, "nopart": 10.0}[policy]
        return ({"completed": len(stream), "failed": 0, "avg_jct_s": jct, "makespan_s": 20.0,
                 "restarts": 1, "restarts_per_job": 0.1}, [])

    monkeypatch.setattr("miso.cli.demo._run_stream", fake_run)
    r = runner.invoke(app, ["demo", "--no-ray", "--jobs", "5", "--seed", "2", "--compare",
                            "nopart", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(doc) == {"miso+", "nopart", "jct_ratio"} and doc["jct_ratio"] == 0.6
    assert seen["miso+"] == seen["nopart"] == demo_jobs(5, seed=2)
    bad = runner.invoke(app, ["demo", "--compare", "bogus"])
    assert bad.exit_code == 2 and "unknown policy" in bad.output


def test_demo__compare_optsta_runs_a_real_static_partition(monkeypatch) -> None:  # noqa: ANN001
    """OptSta gets the best static layout for the demo's stream (the simulator's offline
    search), not the one whole-GPU instance it falls back to without one (= NoPart); every
    policy's options are ones it takes (the controller builds each)."""
    from miso.cli.demo_cluster import demo_trace, policy_args
    from miso.controller import ControllerConfig
    from miso.controller.controller import make_controller_policy

    stream = demo_jobs(8, seed=1)
    assert [t.workload for t in demo_trace(stream)] == [
        c[c.index("--workload") + 1] for _, _, c in stream]
    for p in ("miso+", "miso", "nopart", "optsta", "mps"):
        pol = make_controller_policy(ControllerConfig(policy=p, estimator="true",
                                                      policy_args=policy_args(p, stream, 2,
                                                                              "A100-40GB")))
        if p == "optsta":
            assert pol.layout is not None and len(pol.layout) > 1  # type: ignore[attr-defined]
    seen: dict[str, object] = {}

    def fake_run(policy, stream, gpus, model, no_ray, timeout, out, args):  # noqa: ANN001, ANN202
        seen[policy] = args
        return ({"completed": len(stream), "failed": 0, "avg_jct_s": 5.0, "makespan_s": 20.0,
                 "restarts": 0, "restarts_per_job": 0.0}, [])

    monkeypatch.setattr("miso.cli.demo._run_stream", fake_run)
    r = runner.invoke(app, ["demo", "--no-ray", "--jobs", "6", "--gpus", "2", "--compare",
                            "optsta", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(doc["optsta"]["layout"]) > 1 and seen["miso+"] == {}


@pytest.mark.slow
@pytest.mark.ray
def test_cli__cluster_up_submit_status_logs_cancel_down(tmp_path: Path) -> None:
    sd = str(tmp_path / "state")
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    os.environ.update(env)
    r = runner.invoke(app, ["cluster", "up", "--emulated", "--gpus", "2", "--state-dir", sd,
                            "--profile-seconds", "0.3", "--checkpoint-timeout", "3"])
    assert r.exit_code == 0, r.output
    try:
        emu = [sys.executable, "-m", "miso.emuworkload", "--workload", "bert_train2"]
        r = runner.invoke(app, ["submit", "--state-dir", sd, "--name", "short", "--",
                                *emu, "--iterations", "40", "--ips", "40"])
        assert r.exit_code == 0, r.output
        short = r.stdout.strip()
        r = runner.invoke(app, ["submit", "--state-dir", sd, "--name", "long", "--",
                                *emu, "--iterations", "100000", "--ips", "40"])
        long_id = r.stdout.strip()
        r = runner.invoke(app, ["submit", "--state-dir", sd, "--name", "short", "--", "true"])
        assert r.exit_code == 2 and "already active" in r.output
        r = runner.invoke(app, ["submit", "--state-dir", sd, "--memory-gb", "500", "--",
                                "true"])
        assert r.exit_code == 2 and "largest slice" in r.output
        import time

        deadline = time.time() + 90
        while True:
            r = runner.invoke(app, ["status", "--state-dir", sd, "--json"])
            st = json.loads(r.stdout)
            assert st["api_url"].startswith("http://127.0.0.1:")
            by = {j["id"]: j for j in st["jobs"]}
            if by[short]["state"] == "finished" and by[long_id]["state"] == "running":
                break
            assert time.time() < deadline, st
            time.sleep(1)
        r = runner.invoke(app, ["status", "--state-dir", sd])
        assert "GPUs" in r.stdout and "long" in r.stdout
        r = runner.invoke(app, ["logs", "--state-dir", sd, short])
        assert "bert_train2" in r.stdout
        r = runner.invoke(app, ["cancel", "--state-dir", sd, "long"])
        assert r.exit_code == 0 and "cancelled" in r.stdout
    finally:
        import ray

        ray.shutdown()  # this test process was a Ray client of the cluster
        r = runner.invoke(app, ["cluster", "down", "--state-dir", sd])
    assert r.exit_code == 0, r.output
    assert not (Path(sd) / "cluster.json").exists()
