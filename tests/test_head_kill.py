"""Each job at most once, whatever dies (issue 26, item 2), end to end: ``miso cluster up
--emulated``, 6 checkpointing jobs, the head SIGKILLed (its Ray, agent and controller; jobs and
guards live on) 3 times - right after a decision and at random moments - and ``cluster up``
again each time; a /proc sampler (every 50 ms) sees no job with two attempts alive at once,
none is lost and no progress is lost. The benchmark (``benchmarks/faults/run.py --faults
head-kill``) does 20 cycles. About 2 minutes on 2 cores (116 s measured, 2026-12-02).

The cause it caught: Ray SIGKILLs a dying worker's children, so the agent actor, dying ~3 s
after its head, took every guard with it and their jobs ran on, orphaned, beside the attempts of
the next cluster (:data:`miso.raycluster.RAY_ENV`)."""

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
def test_head_sigkill_cycles__no_job_twice_none_lost_no_progress_lost(tmp_path: Path) -> None:
    out = tmp_path / "head-kill.json"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "faults" / "run.py"),
                        "--faults", "head-kill", "--slow-trials", "1", "--cycles", "3",
                        "--seed", "3", "--json", str(out)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert out.exists(), r.stdout[-2000:] + r.stderr[-2000:]
    got = json.loads(out.read_text())
    s = got["summary"]["head-kill"]
    trial = got["trials"][0]
    assert trial["completed"] and trial["kills_after_decision"] >= 1, trial
    assert (s["jobs"], s["lost"], s["twice"], s["progress_lost"]) == (6, 0, 0, 0), got
