"""Issue 26's end-to-end check of the paths and bounds (run as root):

    python benchmarks/security/paths_check.py [--json out.json]

``miso cluster up --emulated --gpus 2 --fair-share`` in a fresh state dir, a user mapped to a
real, throw-away Unix account, one job of that user printing its bounds (``Max processes``
of /proc/self/limits, ``ulimit -d``, ``ulimit -v``, its cgroup's ``pids.max``/``memory.max``
where it has them);
then every directory the root processes use (Ray's ``--temp-dir``/``--session_dir`` from
/proc, the state dir, the checkpoint and agent roots) is walked: any the account could write
(mode bits along the path, and ``test -w`` as the account) is a failure. Prints one JSON
object; exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from accounts import unix_account  # noqa: E402
from pathaudit import ray_dirs_from_proc, writable_dirs  # noqa: E402

JOB = ("echo nproc=$(awk '/^Max processes/ {print $3}' /proc/self/limits) "
       "data=$(ulimit -d) vmem=$(ulimit -v) pid_max="
       "$(cat /proc/sys/kernel/pid_max); cg=$(cut -d: -f3 /proc/self/cgroup | tail -1); "
       "for f in pids.max memory.max; do [ -r /sys/fs/cgroup$cg/$f ] && "
       "echo $f=$(cat /sys/fs/cgroup$cg/$f); done; true")


def miso(sd: Path, *args: str, token: str | None = None, timeout: float = 300
         ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MISO_STATE_DIR": str(sd), "MISO_CONFIG": str(sd / "no-login.json"),
           "PYTHONPATH": str(ROOT / "src")}
    env.pop("MISO_TOKEN", None)
    if token:
        env["MISO_TOKEN"] = token
    # from /tmp: a job runs in the submitter's directory, which its account must reach
    return subprocess.run([sys.executable, "-m", "miso.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False, cwd="/tmp")


def as_account_writable(name: str, dirs: list[str]) -> list[str]:
    """The dirs ``test -w`` finds writable when run as the account (the kernel's answer)."""
    out = []
    for d in dirs:
        r = subprocess.run(["runuser", "-u", name, "--", "test", "-w", d],
                           capture_output=True, check=False)
        if r.returncode == 0:
            out.append(d)
    return out


def audit(sd: Path, acct: Any, ray_marker: str, res: dict[str, Any],
          extra_roots: tuple[str, ...] = ()) -> None:
    """On a running cluster of state dir ``sd``: a user mapped to ``acct`` runs :data:`JOB`;
    then every directory of Ray's (``--temp-dir``/``--session_dir`` of the running Ray
    processes whose path holds ``ray_marker``), the state dir, its checkpoint and agent roots
    and ``extra_roots`` is walked for dirs the account can write. Fills ``res``."""
    r = miso(sd, "user", "add", "u", "--unix-user", acct.pw_name)
    token = r.stdout.strip().split()[-1] if r.returncode == 0 else ""
    if not token:
        res["error"] = f"user add: {r.stderr.strip()}"
        return
    r = miso(sd, "submit", "--name", "bounds", "--", "/bin/sh", "-c", JOB, token=token)
    jid = r.stdout.strip()
    deadline = time.time() + 120
    state = ""
    while time.time() < deadline:
        st = miso(sd, "status", "--json", token=token)
        js = json.loads(st.stdout)["jobs"] if st.returncode == 0 else []
        state = next((j["state"] for j in js if j["id"] == jid), "")
        if state in ("finished", "failed", "over_limit", "cancelled"):
            break
        time.sleep(1)
    res["job_state"] = state
    logs = miso(sd, "logs", jid, token=token).stdout
    res["job_output"] = [ln for ln in logs.splitlines() if "=" in ln][-4:]
    ray = sorted(ray_dirs_from_proc())
    ours = [d for d in ray if ray_marker in d]
    res["ray_dirs"] = ours
    roots = [*ours, *extra_roots, str(sd), str(sd / "checkpoints"), str(sd / "agents")]
    gids = set(os.getgrouplist(acct.pw_name, acct.pw_gid))
    bad = writable_dirs(roots, acct.pw_uid, gids)
    # a root's parent counts unless it is sticky (/tmp: our entry there stays ours; as
    # writable_dirs); ``miso node --temp-dir /tmp/miso-slurm-...`` names one directly
    every = sorted({str(p) for r0 in [*ours, *extra_roots]
                    for p in [Path(r0), *Path(r0).rglob("*")] if p.is_dir() and not p.is_symlink()}
                   | {str(Path(r0).parent) for r0 in [*ours, *extra_roots]
                      if not Path(r0).parent.lstat().st_mode & stat.S_ISVTX})
    res["dirs_walked"] = len(every)
    res["writable_by_account_modebits"] = bad
    res["writable_by_account_test_w"] = as_account_writable(acct.pw_name, every)


def verdict(res: dict[str, Any]) -> dict[str, Any]:
    """``res`` with the bounds the job printed judged and ``ok`` set."""
    out = " ".join(res.get("job_output", []))
    nums = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    pid_max = int(nums.get("pid_max", "0") or 0)
    procs = nums.get("pids.max") or nums.get("nproc", "")
    mem = nums.get("memory.max") or nums.get("data", "")
    res["process_bound_below_pid_max"] = procs.isdigit() and 0 < int(procs) < pid_max
    res["memory_bound"] = mem.isdigit()
    res["ok"] = (not res.get("error") and res.get("job_state") == "finished"
                 and not res.get("writable_by_account_modebits")
                 and not res.get("writable_by_account_test_w")
                 and res["process_bound_below_pid_max"] and res["memory_bound"]
                 and bool(res.get("ray_dirs")))
    return res


def check() -> dict[str, Any]:
    sd = Path(tempfile.mkdtemp(prefix="miso-pc-"))
    os.chmod(sd, 0o755)  # jobs' accounts must reach their own dirs below it
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        with unix_account("misopc") as acct:
            t0 = time.time()
            r = miso(sd, "cluster", "up", "--emulated", "--gpus", "2", "--fair-share",
                     "--state-dir", str(sd))
            res["up_s"] = round(time.time() - t0, 1)
            if r.returncode != 0:
                res["error"] = f"cluster up: {r.stderr.strip()[-400:]}"
                return verdict(res)
            try:
                audit(sd, acct, "miso-ray-", res)
            finally:
                d = miso(sd, "cluster", "down", "--state-dir", str(sd))
                res["down_rc"] = d.returncode
    finally:
        shutil.rmtree(sd, ignore_errors=True)
    return verdict(res)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (it creates a Unix account)", file=sys.stderr)
        return 2
    res = check()
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
