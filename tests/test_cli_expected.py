"""The commands people expect (issue 33): --version, shell completion, help in plain text,
--watch, --follow, --json twins, the history view, cancel by filter. Fast: CliRunner over a
fake API client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner

from miso import __version__
from miso.cli import app

runner = CliRunner()


def test_version_and_completion() -> None:
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"miso {__version__}"
    env = {**os.environ, "_MISO_COMPLETE": "complete_bash", "COMP_WORDS": "miso sta",
           "COMP_CWORD": "1"}
    out = subprocess.run([sys.executable, "-m", "miso.cli"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert "status" in out.stdout.split()


def test_help_is_plain_text_not_rest() -> None:
    for argv in (["--help"], ["submit", "--help"], ["cluster", "up", "--help"]):
        r = runner.invoke(app, argv)
        assert r.exit_code == 0 and "``" not in r.output, argv


class FakeApi:
    """What the client commands call on :class:`miso.api.client.Client`."""

    def __init__(self) -> None:
        self.jobs_ = [
            {"id": "j0001", "name": "sweep-1", "state": "running", "owner": "u:1",
             "owner_name": "ann", "submitted_at": 1000.0, "started_at": 1010.0,
             "ended_at": None},
            {"id": "j0002", "name": "sweep-2", "state": "queued", "owner": "u:1",
             "owner_name": "ann", "submitted_at": 1020.0, "started_at": None,
             "ended_at": None},
            {"id": "j0003", "name": "train", "state": "finished", "owner": "u:1",
             "owner_name": "ann", "submitted_at": 100.0, "started_at": 130.0,
             "ended_at": 730.0}]
        self.cancelled: list[str] = []
        self.log_polls = 0
        self.status_calls = 0

    def __enter__(self) -> FakeApi:
        return self

    def __exit__(self, *a: object) -> None:
        return None

    def me(self) -> dict:
        return {"id": "u:1", "name": "ann", "admin": False}

    def jobs(self, *, active: bool = False, limit: int | None = None,
             all_users: bool = False) -> list[dict]:
        return [j for j in self.jobs_ if not active or j["state"] not in
                ("finished", "failed", "cancelled")]

    def cancel(self, job: str) -> dict:
        self.cancelled.append(job)
        return {"id": job, "name": job, "state": "cancelled"}

    def job(self, job: str) -> dict:
        return {"id": job, "state": "running" if self.log_polls < 3 else "finished"}

    def logs(self, job: str, tail: int = 200) -> str:
        self.log_polls += 1
        return "\n".join(f"line {i}" for i in range(1, 2 * self.log_polls + 1))

    def status(self, limit: int = 200) -> dict:
        self.status_calls += 1
        if self.status_calls > 2:
            raise KeyboardInterrupt
        return {"user": "ann", "admin": False, "policy": "miso", "gpus": [],
                "jobs": [], "counts": {}}

    def submit(self, command: list[str], **kw: object) -> str:
        return "j0009"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    import miso.cli.client as cc
    import miso.cli.follow as cf

    fake = FakeApi()
    monkeypatch.setattr(cc, "client", lambda *a, **k: fake)
    monkeypatch.setattr(cf.time, "sleep", lambda s: None)
    monkeypatch.setenv("MISO_URL", "http://127.0.0.1:1")  # never the disk fall-back
    return fake


def test_logs_follow_prints_each_line_once_until_the_job_ends(api: FakeApi) -> None:
    r = runner.invoke(app, ["logs", "j0001", "--follow"])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("line")]
    assert lines == [f"line {i}" for i in range(1, 9)]
    assert "(job j0001 finished)" in r.output


def test_status_watch_redraws_until_ctrl_c(api: FakeApi, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    import miso.cli.follow as cf

    monkeypatch.setattr(cf.time, "sleep", lambda s: None)
    r = runner.invoke(app, ["status", "--watch", "--interval", "0.5"])
    assert r.exit_code == 0, r.output
    assert api.status_calls == 3 and r.output.count("Jobs of ann") == 2


def test_cancel_all_and_by_filter(api: FakeApi) -> None:
    r = runner.invoke(app, ["cancel", "--all", "--json"])
    assert r.exit_code == 0, r.output
    assert [j["id"] for j in json.loads(r.output)["jobs"]] == ["j0001", "j0002"]
    api.cancelled.clear()
    r = runner.invoke(app, ["cancel", "--state", "queued", "--name", "sweep-*"])
    assert r.exit_code == 0 and api.cancelled == ["j0002"], r.output
    assert runner.invoke(app, ["cancel"]).exit_code == 2
    assert runner.invoke(app, ["cancel", "j0001", "--all"]).exit_code == 2


def test_history_shows_wait_jct_and_end_and_filters(api: FakeApi) -> None:
    r = runner.invoke(app, ["history", "--json"])
    assert r.exit_code == 0, r.output
    (j,) = json.loads(r.output)["jobs"]
    assert j["id"] == "j0003" and j["wait_s"] == 30.0 and j["jct_s"] == 630.0
    assert j["ended_at"] == 730.0
    r = runner.invoke(app, ["history", "--state", "running", "--since", "500"])
    assert r.exit_code == 0 and "j0001" in r.output and "j0003" not in r.output
    r = runner.invoke(app, ["history"], terminal_width=80)
    assert "10m" in r.output and "30s" in r.output            # JCT 630 s, wait 30 s
    assert max(len(x) for x in r.output.splitlines()) <= 80
    assert runner.invoke(app, ["history", "--owner", "bob"]).exit_code == 2


def test_json_twins_of_submit_and_logs(api: FakeApi) -> None:
    r = runner.invoke(app, ["submit", "--json", "--", "/bin/true"])
    assert r.exit_code == 0 and json.loads(r.output) == {"id": "j0009"}, r.output
    r = runner.invoke(app, ["logs", "j0001", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["job"] == "j0001", r.output


def test_events_takes_url_token_and_token_file(tmp_path: Any) -> None:
    r = runner.invoke(app, ["events", "--help"])
    assert all(f in r.output for f in ("--url", "--token", "--token-file", "--json"))
    tf = tmp_path / "tok"
    tf.write_text("secret\n")
    r = runner.invoke(app, ["events", "--url", "http://127.0.0.1:9", "--token-file", str(tf)])
    assert r.exit_code != 0 and "no API answers at http://127.0.0.1:9" in r.output


def test_cluster_up_reads_its_settings_from_a_config_file(tmp_path: Any,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The file's values are the flags' defaults (checked before anything starts); a flag on
    the command line wins; an unknown key is refused with the known ones."""
    from miso import raycluster

    def never(*a: object, **k: object) -> None:
        raise AssertionError("this test starts no cluster")

    monkeypatch.setattr(raycluster, "spawn_local_head", never)
    monkeypatch.setenv("MISO_STATE_DIR", str(tmp_path / "sd"))
    cfg = tmp_path / "cluster.toml"
    cfg.write_text('emulated = true\ngpus = 2000\nfair-share = true\nhalf-life = 3600\n')
    r = runner.invoke(app, ["cluster", "up", "--config", str(cfg)])
    assert r.exit_code == 2 and "--gpus 2000" in r.output, r.output
    r = runner.invoke(app, ["cluster", "up", "--config", str(cfg), "--gpus", "0"])
    assert r.exit_code == 2 and "--gpus must be at least 1" in r.output, r.output
    monkeypatch.setenv("MISO_CLUSTER_CONFIG", str(cfg))
    assert "--gpus 2000" in runner.invoke(app, ["cluster", "up"]).output
    cfg.write_text('polcy = "miso"\n')
    r = runner.invoke(app, ["cluster", "up", "--config", str(cfg)])
    assert r.exit_code == 2 and "unknown key 'polcy'" in r.output and "policy" in r.output


def test_the_units_and_the_batch_script_read_the_config_file(tmp_path: Any) -> None:
    from pathlib import Path

    from miso.deploy.upconfig import config_sets, read_up_config

    root = Path(__file__).resolve().parents[1]
    sample = read_up_config(root / "deploy/systemd/cluster.toml")
    assert sample["listen"] and sample["tls_cert"] and sample["policy"] == "miso+"
    head = (root / "deploy/systemd/miso-head.service").read_text()
    assert "MISO_CLUSTER_CONFIG=/etc/miso/cluster.toml" in head and "--listen" not in head
    assert "MISO_CLUSTER_CONFIG" in (root / "deploy/slurm/miso.sbatch").read_text()
    f = tmp_path / "c.toml"
    f.write_text('listen = "0.0.0.0:8443"\n')
    assert config_sets(["--config", str(f)], "listen")
    assert config_sets([], "listen", env={"MISO_CLUSTER_CONFIG": str(f)})
    assert not config_sets([], "listen", env={})


def test_miso_web_prints_the_page_with_the_token_in_the_fragment(api: FakeApi) -> None:
    api.url, api.token = "https://head:8443", "t/k+n"  # type: ignore[attr-defined]
    r = runner.invoke(app, ["web"])
    assert r.exit_code == 0 and r.output.strip() == "https://head:8443/#token=t%2Fk%2Bn"


def test_requeue_submits_an_ended_job_again(api: FakeApi, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    sent: dict[str, Any] = {}
    api.job = lambda j: {"id": "j0003", "name": "train", "state": "failed",  # type: ignore
                         "command": ["python", "t.py"], "env": {"A": "1"}, "cwd": "/w",
                         "memory_gb": 8.0, "workload": None}
    api.submit = lambda cmd, **kw: sent.update(cmd=cmd, **kw) or "j0010"  # type: ignore
    r = runner.invoke(app, ["requeue", "train", "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == {"id": "j0010", "from": "j0003"}
    assert sent["cmd"] == ["python", "t.py"] and sent["name"] == "train"
    assert sent["env"] == {"A": "1"} and sent["cwd"] == "/w" and sent["memory_gb"] == 8.0
    api.job = lambda j: {"id": "j0001", "name": "x", "state": "running"}  # type: ignore
    assert runner.invoke(app, ["requeue", "j0001"]).exit_code == 2


def test_priority_names_are_echoed_as_names() -> None:
    from miso.cli.quota import priority_words

    assert priority_words(100) == "high (100)" and priority_words(-100) == "low (-100)"
    assert priority_words(42) == "42" and priority_words(None) == "-"


def test_slurm_ports_of_a_running_allocation_are_its_own_block(tmp_path: Any) -> None:
    ports = {"block": 7, "gcs": 20700, "api": 20707}
    (tmp_path / "slurm.json").write_text(json.dumps({"job_id": 123, "ports": ports}))
    r = runner.invoke(app, ["slurm", "ports", "--job-id", "123", "--state-dir", str(tmp_path)])
    assert r.exit_code == 0 and json.loads(r.output) == ports, r.output
    r = runner.invoke(app, ["slurm", "ports", "--job-id", "124", "--state-dir", str(tmp_path),
                            "--no-check"])
    assert r.exit_code == 0 and json.loads(r.output) != ports, r.output


def test_simulate_with_tenants_prints_per_owner_results() -> None:
    r = runner.invoke(app, ["simulate", "--gpus", "2", "--jobs", "12", "--tenants", "2",
                            "--fair-share", "--policy", "miso+"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "Per owner" in r.output and "u0" in r.output and "u1" in r.output
    assert "Jain's fairness index" in r.output


def test_simulate_json_dash_prints_json_like_every_other_command() -> None:
    r = runner.invoke(app, ["simulate", "--gpus", "2", "--jobs", "8", "--policy", "miso+",
                            "--json", "-"])
    assert r.exit_code == 0, r.output
    assert "miso+" in json.loads(r.stdout)["policies"]


def test_user_add_json_on_a_new_cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    for v in ("MISO_URL", "MISO_TOKEN"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("MISO_CONFIG", str(tmp_path / "none.json"))
    r = runner.invoke(app, ["user", "add", "root", "--admin", "--json", "--state-dir",
                            str(tmp_path / "sd")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["name"] == "root" and out["admin"] is True and len(out["token"]) > 20
    for cmd in (["user", "remove", "--help"], ["user", "rotate", "--help"]):
        assert "--json" in runner.invoke(app, cmd).output
