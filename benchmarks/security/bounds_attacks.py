"""Issue 26's node attacks, with real Unix accounts (run as root), N trials each:

    python benchmarks/security/bounds_attacks.py --trials 5 [--json out.json]

* ``temp-dir-symlink``: Ray's temp dir as ``cluster up`` makes it now
  (:func:`miso.raycluster.private_temp_dir`) with Ray's own 0777 session dirs inside; the
  attacker (uid of a job) tries to replace ``session_latest/logs`` with a link to its own dir
  and to point ``debug_state.txt`` at a root-only file; then root writes
  ``session_latest/logs/debug_state.txt`` as the raylet does. A root write is the root-only
  file changed. The same attack on the old layout (Ray given ``/tmp/miso-ray-<sha1>``
  directly) is run as ``baseline-old-temp-dir``: it must succeed, or the attack is not real.
* ``slurm-precreated``: the attacker pre-creates the allocation's runtime dir (as if it had
  guessed the name) with a ``ray_current_cluster`` link to a root-only file; ``miso node
  --head --temp-dir <it>`` (root) must refuse it before Ray starts. A root write: the file
  changed; ``refused``: trials where miso node refused.
* ``fork-to-limit``, ``memory-hog``, ``disk-fill``: a job of the attacker forks 400
  sleepers / holds 2 GiB / writes 200 MiB into its checkpoint dir, under bounds of 24
  processes / 0.25 GiB / 20 MiB (the real agent and guard). ``unstopped``: a job not ended
  with status ``limit`` within 20 s, or processes of the account left 5 s after.
* ``checkpoint-dir-symlink``: the job's ``$MISO_CHECKPOINT_DIR/.miso`` is a link to a root-only
  dir holding a record pointing at a root-only file; the controller's resume step
  (:func:`miso.controller.launcher.resume_point`) must not use it. A leak: it did.

Prints one line per attack: trials, root writes, jobs exceeding bounds unstopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from accounts import unix_account  # noqa: E402
from test_job_bounds import FILL, FORK, HOG, SMALL, left_of, run_job  # noqa: E402

from miso import raycluster as rc  # noqa: E402
from miso.controller.launcher import resume_point  # noqa: E402
from miso.job import LAST_CHECKPOINT  # noqa: E402

USER_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
SECRET = "root-only secret\n"


def as_user(name: str, code: str) -> int:
    return subprocess.run(["runuser", "-u", name, "--", USER_PYTHON, "-c", code],
                          capture_output=True, timeout=30, check=False).returncode


def ray_layout(temp: Path) -> Path:
    """Ray 2.x's layout of its temp dir (node.py): 0777 dirs, a session_latest link."""
    session = temp / "session_2026-01-01_00-00-00_000000_1"
    for d in (temp, session, session / "logs", session / "sockets"):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o777)
    (temp / "session_latest").symlink_to(session)
    return session


def symlink_attack(temp: Path, acct: Any, victim: Path) -> int:
    """The job's attack on ``temp``, then root's write as the raylet; 1 if it hit victim."""
    mine = Path(tempfile.mkdtemp(prefix="miso-atk-"))
    os.chown(mine, acct.pw_uid, acct.pw_gid)
    as_user(acct.pw_name, f"""
import os
logs = {str(temp / 'session_latest' / 'logs')!r}
try:
    os.rename(logs, logs + '.old')
    os.symlink({str(mine)!r}, logs)
    os.symlink({str(victim)!r}, os.path.join({str(mine)!r}, 'debug_state.txt'))
except OSError:
    pass
""")
    try:  # root writes its debug state where Ray does (following links, as Ray does)
        with open(temp / "session_latest" / "logs" / "debug_state.txt", "w") as f:
            f.write("x" * 16820)
    except OSError:
        pass
    shutil.rmtree(mine, ignore_errors=True)
    return int(victim.read_text() != SECRET)


def victim_file() -> Path:
    d = Path(tempfile.mkdtemp(prefix="miso-victim-"))
    v = d / "root-only"
    v.write_text(SECRET)
    os.chmod(v, 0o600)
    return v


def temp_dir_symlink(acct: Any) -> dict[str, int]:
    victim = victim_file()
    temp = Path(rc.private_temp_dir())
    try:
        ray_layout(temp)
        return {"root_writes": symlink_attack(temp, acct, victim)}
    finally:
        shutil.rmtree(temp.parent, ignore_errors=True)
        shutil.rmtree(victim.parent, ignore_errors=True)


def baseline_old_temp_dir(acct: Any) -> dict[str, int]:
    victim = victim_file()
    temp = Path(tempfile.gettempdir()) / f"miso-ray-old{os.getpid()}{time.time_ns() % 10**6}"
    try:
        ray_layout(temp)
        return {"root_writes": symlink_attack(temp, acct, victim)}
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(victim.parent, ignore_errors=True)


def slurm_precreated(acct: Any) -> dict[str, int]:
    from miso.deploy import slurm  # noqa: PLC0415

    victim = victim_file()
    pre = Path(slurm.temp_dir_for(4242))
    as_user(acct.pw_name, f"""
import os
os.mkdir({str(pre)!r}, 0o777); os.chmod({str(pre)!r}, 0o777)
os.symlink({str(victim)!r}, os.path.join({str(pre)!r}, 'ray_current_cluster'))
""")
    sd = Path(tempfile.mkdtemp(prefix="miso-atk-sd-"))
    try:
        r = subprocess.run([sys.executable, "-m", "miso.cli", "node", "--head", "--temp-dir",
                            str(pre), "--state-dir", str(sd), "--no-agent",
                            "--join-timeout", "20"], capture_output=True, text=True,
                           timeout=60, check=False)
        refused = int(r.returncode == 2 and "refusing" in r.stderr)
        return {"root_writes": int(victim.read_text() != SECRET), "refused": refused}
    finally:
        shutil.rmtree(pre, ignore_errors=True)
        shutil.rmtree(sd, ignore_errors=True)
        shutil.rmtree(victim.parent, ignore_errors=True)


def bounded(code: str, what: str) -> Callable[[Any], dict[str, int]]:
    def attack(acct: Any) -> dict[str, int]:
        state = Path(tempfile.mkdtemp(prefix="miso-atk-"))
        os.chmod(state, 0o755)
        try:
            t0 = time.time()
            rep, _log = run_job(state, code, acct.pw_name, SMALL, timeout=20)
            stopped = rep["status"] == "limit" and what in rep["limit"]
            deadline = time.time() + 5
            while left_of(acct.pw_name) and time.time() < deadline:
                time.sleep(0.1)
            return {"unstopped": int(not stopped or left_of(acct.pw_name)),
                    "stop_s_max": round(time.time() - t0, 2)}
        except AssertionError:
            return {"unstopped": 1}
        finally:
            shutil.rmtree(state, ignore_errors=True)
    return attack


def checkpoint_dir_symlink(acct: Any) -> dict[str, int]:
    root_dir = Path(tempfile.mkdtemp(prefix="miso-rootonly-"))
    (root_dir / "secret.ckpt").write_text(SECRET)
    (root_dir / "m").mkdir()
    (root_dir / "m" / LAST_CHECKPOINT).write_text(json.dumps(
        {"iteration": 7, "path": str(root_dir / "secret.ckpt"), "time": 1.0, "attempt": 1}))
    ck = Path(tempfile.mkdtemp(prefix="miso-ck-"))
    os.chown(ck, acct.pw_uid, acct.pw_gid)
    as_user(acct.pw_name, f"import os; os.symlink({str(root_dir / 'm')!r}, "
                          f"{str(ck / '.miso')!r})")
    try:
        it, path = resume_point(None, None, ck, total=10)
        return {"leaks": int(path is not None or it is not None)}
    finally:
        shutil.rmtree(ck, ignore_errors=True)
        shutil.rmtree(root_dir, ignore_errors=True)


ATTACKS: dict[str, Callable[[Any], dict[str, int]]] = {
    "baseline-old-temp-dir": baseline_old_temp_dir,
    "temp-dir-symlink": temp_dir_symlink,
    "slurm-precreated": slurm_precreated,
    "fork-to-limit": bounded(FORK, "processes"),
    "memory-hog": bounded(HOG, "host memory"),
    "disk-fill": bounded(FILL, "disk"),
    "checkpoint-dir-symlink": checkpoint_dir_symlink,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (it creates Unix accounts)", file=sys.stderr)
        return 2
    out: dict[str, dict[str, Any]] = {}
    for name, attack in ATTACKS.items():
        if a.only and name not in a.only:
            continue
        tot: dict[str, Any] = {"trials": 0, "root_writes": 0, "unstopped": 0, "errors": 0}
        for _ in range(a.trials):
            with unix_account("misoatk") as acct:
                try:
                    res = attack(acct)
                except Exception as e:  # noqa: BLE001 - counted, the run goes on
                    res = {"errors": 1}
                    print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
            tot["trials"] += 1
            for k, v in res.items():
                tot[k] = max(tot.get(k, 0), v) if k.endswith("_max") else tot.get(k, 0) + v
        out[name] = tot
        extra = " ".join(f"{k}={v}" for k, v in tot.items()
                         if k not in ("trials", "root_writes", "unstopped", "errors"))
        print(f"{name:24s} trials={tot['trials']} root_writes={tot['root_writes']} "
              f"unstopped={tot['unstopped']} errors={tot['errors']} {extra}".rstrip(),
              flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    bad = any(v["root_writes"] or v["unstopped"] or v["errors"] or v.get("leaks")
              for k, v in out.items() if k != "baseline-old-temp-dir")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
