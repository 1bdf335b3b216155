"""How long a miso cluster in a Slurm allocation takes to start and to go away.

A real Slurm (Debian's slurm-wlm + munge) on this machine, one node with 4 count-only GPUs
(tests/slurmlab.py); each run submits deploy/slurm/miso.sbatch (``--emulated --gpus 4``) and
measures

* ``sbatch -> API up``: until ``miso slurm run`` records the API (Ray head, node, controller,
  agents, API all up);
* ``API up -> first job running``: a job submitted at once, until it reports progress (its
  process started, it computes);
* ``sbatch -> first job running``: the two together;
* ``scancel -> clean node``: with that job running, until the allocation has left the queue,
  no process carries its ``SLURM_JOB_ID`` and its Ray temp dir is gone; the job saved first.

Two ways to end it alternate: ``plain`` (``scancel JOB``: SIGTERM to every process at once,
SIGKILL after KillWait = 30 s) and ``orderly`` (``scancel --batch --signal=TERM JOB``, what
``#SBATCH --signal=B:TERM@120`` sends before the time limit).

    python benchmarks/deploy/slurm.py --runs 3 --json out.json

Needs root and the Slurm binaries (apt-get install slurm-wlm munge).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from slurmlab import SlurmLab, missing, processes_of_job  # noqa: E402

SBATCH = ROOT / "deploy" / "slurm" / "miso.sbatch"
JOB = [sys.executable, "-m", "miso.emuworkload", "--workload", "resnet_train128",
       "--iterations", "100000", "--ips", "40"]


def miso(sd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "miso.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "MISO_STATE_DIR": str(sd)})


def state(sd: Path) -> dict[str, Any]:
    try:
        return json.loads((sd / "slurm.json").read_text())
    except (OSError, ValueError):
        return {}


def until(pred: Any, timeout: float, what: str) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return time.time()
        time.sleep(0.1)
    raise RuntimeError(f"timed out: {what}")


def one_run(lab: SlurmLab, work: Path, i: int, how: str) -> dict[str, Any]:
    sd = work / f"state{i}"
    out = work / f"alloc{i}.out"
    env = {"MISO_STATE_DIR": str(sd), "MISO": f"{sys.executable} -m miso.cli",
           "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.time()
    r = lab.run(["sbatch", "--parsable", f"--gres=gpu:{lab.gpus}", f"--output={out}",
                 str(SBATCH), "--emulated", "--gpus", "4", "--profile-seconds", "0.5"], env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    job = r.stdout.strip().split(";")[0]
    t_up = until(lambda: state(sd).get("api_url") and state(sd).get("job_id") == int(job),
                 300, f"miso up in allocation {job}:\n{out.read_text() if out.exists() else ''}")
    s = miso(sd, "submit", "--name", "first", "--memory-gb", "4", "--", *JOB)
    if s.returncode != 0:
        raise RuntimeError(s.stderr)

    def first() -> bool:
        st = miso(sd, "status", "--json")
        if st.returncode != 0:
            return False
        js = json.loads(st.stdout)["jobs"]
        return bool(js) and (js[0].get("iteration") or 0) > 0
    t_run = until(first, 120, "the first job running")
    time.sleep(2.0)  # it runs a while before the cancel
    t1 = time.time()
    lab.run(["scancel", *(["--batch", "--signal=TERM"] if how == "orderly" else []), job])
    t_clean = until(lambda: not lab.job_state(job) and not processes_of_job(job)
                    and not list(Path("/tmp").glob(f"miso-slurm-{job}-*")),  # noqa: S108
                    120, "a clean node")
    saved = sorted((sd / "agents").glob("*/jobs/*/attempt-*/output.log"))
    return {"run": i, "end": how, "job": job,
            "sbatch_to_api_s": round(t_up - t0, 2),
            "api_to_first_running_s": round(t_run - t_up, 2),
            "sbatch_to_first_running_s": round(t_run - t0, 2),
            "scancel_to_clean_s": round(t_clean - t1, 2),
            "job_saved": any("checkpointed at" in p.read_text() for p in saved)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per way of ending (max 10)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    why = missing()
    if why:
        print(f"skipped: {why}")
        return 0
    runs = max(1, min(a.runs, 10))
    results = []
    with SlurmLab(gpus=4) as lab, tempfile.TemporaryDirectory(prefix="misobench-") as tmp:
        for i in range(2 * runs):
            res = one_run(lab, Path(tmp), i, "plain" if i % 2 == 0 else "orderly")
            print(json.dumps(res), flush=True)
            results.append(res)
    summary: dict[str, Any] = {"runs": results, "median": {}}
    for how in ("plain", "orderly"):
        rs = [r for r in results if r["end"] == how]
        summary["median"][how] = {k: statistics.median(r[k] for r in rs) for k in (
            "sbatch_to_api_s", "api_to_first_running_s", "sbatch_to_first_running_s",
            "scancel_to_clean_s")}
        summary["median"][how]["jobs_saved"] = f"{sum(r['job_saved'] for r in rs)}/{len(rs)}"
    print(json.dumps(summary["median"], indent=1))
    if a.json:
        a.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
