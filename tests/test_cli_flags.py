"""One meaning per flag name across commands (old spellings kept as hidden aliases), help
texts that say the defaults, and output that is not cut when piped."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miso.cli import app

runner = CliRunner()


def _help(*cmd: str) -> str:
    r = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return r.output


def _flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


@pytest.mark.parametrize("cmd", [("layouts",), ("optimize",), ("simulate",), ("demo",),
                                 ("cluster", "up")])
def test_a_gpu_model_is_gpu_model_everywhere(cmd: tuple[str, ...]) -> None:
    flags = _flags(_help(*cmd))
    assert "--gpu-model" in flags and "--gpu" not in flags


def test_events_takes_a_gpu_id_and_policy_is_one_name() -> None:
    flags = _flags(_help("events"))
    assert "--gpu-id" in flags and "--gpu" not in flags
    for cmd in (("simulate",), ("demo",), ("cluster", "up"), ("events",)):
        flags = _flags(_help(*cmd))
        assert "--policy" in flags and "--policies" not in flags, cmd


def test_old_spellings_still_work_and_agree(tmp_path: Path) -> None:
    new = runner.invoke(app, ["layouts", "--gpu-model", "A100-40GB", "--maximal", "--json"])
    old = runner.invoke(app, ["layouts", "--gpu", "A100-40GB", "--maximal", "--json"])
    assert new.exit_code == old.exit_code == 0 and new.stdout == old.stdout
    both = runner.invoke(app, ["layouts", "--gpu", "A30", "--gpu-model", "A100-40GB"])
    assert both.exit_code == 2 and "old spelling of --gpu-model" in both.output
    none = runner.invoke(app, ["layouts"])
    assert none.exit_code == 2 and "--gpu-model" in none.output
    log = tmp_path / "ev.jsonl"
    args = ["simulate", "--gpus", "2", "--jobs", "6", "--events", str(log)]
    assert runner.invoke(app, [*args, "--policy", "miso+"]).exit_code == 0
    old_sim = runner.invoke(app, ["simulate", "--gpus", "2", "--jobs", "6", "--policies",
                                  "nopart", "--gpu", "A30"])
    assert old_sim.exit_code == 0, old_sim.output
    gpus = {r["gpu"] for r in map(json.loads, log.read_text().splitlines()) if r.get("gpu")}
    g = sorted(gpus)[0]
    by_id = runner.invoke(app, ["events", "--file", str(log), "--gpu-id", g, "--json"])
    by_old = runner.invoke(app, ["events", "--file", str(log), "--gpu", g, "--json"])
    assert by_id.exit_code == 0 and by_id.stdout == by_old.stdout
    got = {e["gpu"] for e in json.loads(by_id.stdout)["events"]}
    assert got == {g}


def test_submit_help_says_the_defaults_and_the_name_rule() -> None:
    text = " ".join(_help("submit").split())
    assert "[default: 1 GiB" in text
    assert "failed or cancelled job's name is free again" in text
    # the job does get the agent's environment (less miso's and Ray's variables)
    assert "agent's environment" in text and "only the variables given" not in text


def test_cluster_down_with_nothing_running_says_so(tmp_path: Path) -> None:
    r = runner.invoke(app, ["cluster", "down", "--state-dir", str(tmp_path)],
                      env={"RAY_ADDRESS": None})
    assert r.exit_code == 0, r.output
    assert "nothing to stop" in r.output and "--address" not in r.output


def test_piped_tables_are_printed_in_full() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-c", "from miso.cli import app; app()", "simulate",
                        "--gpus", "2", "--jobs", "5", "--policy", "nopart,miso+"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if "nopart" in ln or "miso+" in ln]
    assert len(rows) == 2 and all(len(ln) > 80 for ln in rows)
