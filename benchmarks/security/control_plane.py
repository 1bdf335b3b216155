"""Attacks on the control plane (issue 15, items 3, 6, 7), each run ``trials`` times.

    python benchmarks/security/control_plane.py --trials 10 --json cp.json [--only NAME,...]

:func:`attacks` maps a name to ``function(trials) -> dict`` of counts (``trials``, and
``escalations`` / ``lost`` / ``twice`` / ``affected`` / ``leaks`` ... that must all be 0);
``benchmarks/security/run.py`` runs them with the job-side attacks.

* ``agent-sigkill``: a real ``miso cluster up --emulated`` (2 GPUs); per trial 4 jobs of 8 s
  (checkpoint every 0.5 s) are submitted through the API, and once they run the agent actor's
  process is SIGKILLed - no harness help: Ray brings the agent back, the controller fences the
  node and moves the jobs. Counts jobs lost, jobs that ran twice (two live copies at once,
  sampled from /proc every 50 ms, or an attempt started after one that finished), trials whose
  ``miso status`` showed the node lost, and the seconds from the kill until a job process runs
  again (``recover_s``; target <= 60 s).
* ``user-recreate``: bob submits a job, is removed and re-created under the same name; the new
  bob tries to read, list, cancel and see the logs of the old bob's job (escalations).
* ``users-db-loss``: ``users.db`` of a state directory with jobs is deleted (odd trials) or
  damaged (even); the API must refuse to start with one line (``accepted`` counts starts).
* ``request-id-reuse``: the same ``request_id`` with another payload (409 expected).
* ``unix-user``: an admin asks for ``--unix-user 0``, ``root`` and an account that does not
  exist (each accepted one is an escalation).
* ``token-fallback``: ``miso status --token ''`` beside an operator token (a run that answers
  is an escalation).
* ``metrics-anonymous``: ``GET /metrics`` without a token on a loopback API.
* ``cross-user-views``: alice reads status, jobs, events, the web page's cluster view and
  ``/metrics``; any id, name or user name of bob's jobs in them is a leak.
* ``gpus-bound``: ``miso cluster up --emulated --gpus 100000`` (refused with one line?).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MISO_CONFIG": "/nonexistent/miso.json"}


def _faults() -> Any:
    """The fault benchmark's /proc sampler and store reader (benchmarks/faults/run.py)."""
    spec = importlib.util.spec_from_file_location("miso_bench_faults",
                                                  ROOT / "benchmarks" / "faults" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def miso(*args: str, timeout: float = 300.0, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    """The real ``miso`` command line (a new process)."""
    return subprocess.run([sys.executable, "-c", "from miso.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout, env=env or ENV,
                          check=False)


def job_cmd(seconds: float, ips: float = 20.0) -> list[str]:
    return [sys.executable, "-m", "miso.emuworkload", "--workload", "bert_train2",
            "--iterations", str(int(seconds * ips)), "--ips", str(ips),
            "--checkpoint-every", "0.5"]


# ---- agent SIGKILL under `miso cluster up` --------------------------------------------------


def _job_pids(mark: str) -> set[int]:
    from miso.backend.emulated import pids_with_env

    out = set()
    for pid in pids_with_env("MISO_BENCH", mark):
        with contextlib.suppress(OSError):
            if b"guard.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
    return out


def _ran_after_finish(sd: Path, ids: list[str]) -> int:
    """Jobs with an attempt started after one of their attempts had finished."""
    con = sqlite3.connect(f"file:{sd / 'miso.db'}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT job, attempt, status, started_at, ended_at FROM attempts "
                           "ORDER BY job, attempt").fetchall()
    finally:
        con.close()
    bad = set()
    for job, _, status, _, ended in rows:
        if job in ids and status == "finished" and \
                any(j == job and s > (ended or 0) for j, _, _, s, _ in rows):
            bad.add(job)
    return len(bad)


def agent_sigkill(trials: int, *, jobs: int = 4, seconds: float = 8.0) -> dict[str, Any]:
    """See the module docstring."""
    from miso import raycluster as rc
    from miso.api.client import Client
    from miso.api.credentials import from_state_dir

    faults = _faults()
    sd = Path(tempfile.mkdtemp(prefix="miso-sec-agent-kill-")) / "state"
    r = miso("cluster", "up", "--emulated", "--gpus", "2", "--state-dir", str(sd),
             "--profile-seconds", "0.3", "--checkpoint-timeout", "3")
    if r.returncode != 0:
        raise RuntimeError(f"cluster up failed: {r.stderr.strip()}")
    out: dict[str, Any] = {"trials": trials, "jobs": 0, "lost": 0, "twice": 0,
                           "lost_shown": 0, "recover_s": [], "escalations": 0}
    try:
        cred = from_state_dir(sd)
        c = Client(str(cred.url), str(cred.token))
        for k in range(trials):
            mark = f"cp-{uuid.uuid4().hex[:8]}"
            samp = faults.Sampler(mark)
            samp.start()
            ids = [c.submit(job_cmd(seconds), name=f"t{k}-{i}", env={"MISO_BENCH": mark})
                   for i in range(jobs)]
            faults.wait_until(lambda m=mark: len(_job_pids(m)) >= 2, 120, 0.1)
            time.sleep(1.0)  # a checkpoint or two
            before = _job_pids(mark)
            pids = rc.local_agent_pids(sd)
            if len(pids) != 1:
                raise RuntimeError(f"expected one agent process, found {pids}")
            t_kill = time.time()
            os.kill(pids[0], signal.SIGKILL)
            shown, back = False, None
            deadline = t_kill + 300
            while time.time() < deadline:
                if back is None and _job_pids(mark) - before:
                    back = time.time() - t_kill
                with contextlib.suppress(Exception):
                    st = c.status()
                    shown = shown or bool(st.get("lost_nodes"))
                    if all(j["state"] in ("finished", "failed", "cancelled")
                           for j in st["jobs"] if j["id"] in ids):
                        break
                time.sleep(0.25)
            copies = samp.finish()
            st = c.status(limit=100_000)
            done = {j["id"] for j in st["jobs"] if j["state"] == "finished"}
            out["jobs"] += len(ids)
            out["lost"] += sum(j not in done for j in ids)
            out["twice"] += sum(n > 1 for n in copies.values()) + _ran_after_finish(sd, ids)
            out["lost_shown"] += int(shown)
            out["recover_s"].append(round(back, 1) if back is not None else None)
            print(f"agent-sigkill trial {k}: lost {sum(j not in done for j in ids)}, "
                  f"status showed it lost {shown}, jobs moving again after {back}", flush=True)
    finally:
        miso("cluster", "down", "--state-dir", str(sd))
    rec = [x for x in out["recover_s"] if x is not None]
    out["max_recover_s"] = max(rec) if rec else None
    out["within_60s"] = sum(x <= 60 for x in rec)
    return out


def attacks() -> dict[str, Callable[[int], dict[str, Any]]]:
    """Name -> ``function(trials)`` returning counts (see the module docstring)."""
    return {"agent-sigkill": agent_sigkill}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated attack names")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    table = attacks()
    names = [n for n in a.only.split(",") if n] or list(table)
    results = {}
    for n in names:
        t0 = time.time()
        results[n] = {**table[n](a.trials), "wall_s": round(time.time() - t0, 1)}
        print(json.dumps({n: results[n]}), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
