"""Security benchmark (issue 15): one tenant attacks the node and the other tenants, N trials
of each attack, with real Unix accounts (created and removed here: run as root).

    python benchmarks/security/run.py --trials 5 --json security.json
    python benchmarks/security/run.py --suite issue26 --trials 5 --json trust.json

Each trial starts an emulated cluster in this process (:class:`miso.cluster.local.
LocalCluster`: the controller, the real agent and guard, real job processes; the transport is
in-process instead of Ray, the agent runs as root as under ``miso cluster up``). Jobs are
submitted as the API does after authentication (owner + Unix account). Attacks:

* ``env-pythonpath``: a job of the attacker writes ``json.py``/``subprocess.py``/... hooks in its
  own directory; a second job runs with ``--env PYTHONPATH=<that directory>``. Each hook records
  the uid it ran as: a record of another uid than the attacker's is an escalation.
* ``env-ld-preload``: the attacker's job builds a constructor library with gcc; a second job
  runs with ``--env LD_PRELOAD=<it>`` (and ``LD_LIBRARY_PATH``). Same count.
* ``progress-garbage``: the attacker's job writes bad progress files (``{"time": "x"}``,
  ``[1]``, NaN, 10**400, deep nesting, random bytes, a FIFO, a symlink to ``/dev/zero``, 2 MiB)
  while another tenant's jobs run. Affected: a victim job not finished, finished later than
  ``--late`` seconds after its submission, or with invalid reports; every job (the attacker's
  too) must finish exactly once.
* ``checkpoint-record``: the attacker's checkpoint record (``.miso/last-checkpoint.json``) is a
  FIFO, a symlink, a NUL path, a string iteration...; the controller's resume step
  (``launcher.resume_point``) reads it. Affected: one that raises or blocks (> 5 s).
* ``log-flood``: the attacker's job writes ``--flood-mb`` MB to stdout while another tenant's
  jobs run; figures: the log's size against the cap, ``logs --tail 3`` time, the reader's
  peak memory (tracemalloc) and this process's RSS growth (the agent runs in it).
* ``escape-cancel``, ``escape-exit``, ``escape-fence``, ``escape-down``: the attacker's job
  starts a ``setsid()``'d child and a double-forked one, both sleeping forever; then it is
  cancelled / its main process exits / its node is fenced (the controller stops renewing the
  lease) / the node shuts down (``cluster down``). Outliving: processes of the attacker's
  account alive 2 s later.

Counts per attack (summed over trials): ``escalations``, ``affected``, ``outliving``,
``lost``, ``twice`` (standard keys) and attack-specific figures.

More attacks: a module ``benchmarks/security/control_plane.py`` next to this file, if
present, defines ``def attacks() -> dict[str, Callable[[Env], dict[str, int | float]]]``.
Each attack is called once per trial with an :class:`Env` (``trial``, ``account()``: a
context manager yielding the ``pwd`` entry of a fresh account removed after, with its
processes; ``tmpdir()``: a directory under /tmp that accounts can traverse, removed at the
end; ``user_python``: a Python any account can run; ``src``: this checkout's ``src`` for
``PYTHONPATH``) and returns counts, using the standard keys above where they apply (0 is the
target of each) and any other key for its own figures. Results are summed over trials; a
raised exception counts as ``errors: 1`` for that trial.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig
from miso.controller.launcher import resume_point
from miso.job import LAST_CHECKPOINT

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the helpers shared with the tests
from accounts import unix_account  # noqa: E402
from helpers import VICTIM  # noqa: E402

SRC = ROOT / "src"
USER_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
CFG: dict[str, Any] = {"profile_seconds_per_level": 0.3, "profile_warmup_s": 0.15,
                       "checkpoint_timeout": 3.0, "poll_interval": 0.1, "lease_s": 2.0}
STANDARD = ("escalations", "affected", "outliving", "lost", "twice")
#: Figures summarised by their largest value over trials (the other keys are counts: summed).
MAXED = ("log_mib", "cap_mib", "tail_ms", "tail_peak_mib", "rss_growth_mib", "stop_s",
         "in_use_peak", "l_wait_s")
Attack = Callable[["Env"], dict[str, Any]]


class Env:
    """What an attack gets (see the module docstring)."""

    def __init__(self, trial: int, opts: argparse.Namespace) -> None:
        self.trial = trial
        self.opts = opts
        self.user_python = USER_PYTHON
        self.src = str(SRC)
        self._dirs: list[str] = []

    def account(self, prefix: str = "msec") -> contextlib.AbstractContextManager[pwd.struct_passwd]:
        """A throw-away Unix account (the tests' helper, tests/accounts.py)."""
        return unix_account(prefix)

    def tmpdir(self) -> Path:
        d = tempfile.mkdtemp(prefix="miso-secbench-")
        os.chmod(d, 0o755)
        self._dirs.append(d)
        return Path(d)

    def close(self) -> None:
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)


# ---- helpers ----------------------------------------------------------------------------------

@contextlib.contextmanager
def cluster(env: Env, **kw: Any) -> Iterator[LocalCluster]:
    c = LocalCluster(env.tmpdir() / "state", config=ControllerConfig(**CFG), rate_window=0.5,
                     gpus_per_node=kw.pop("gpus", 2), **kw)
    try:
        yield c
    finally:
        c.close()


def submit(c: LocalCluster, acct: pwd.struct_passwd, cmd: list[str], **env: str) -> str:
    return c.submit(cmd, memory_gb=1.0, owner=acct.pw_name, unix_user=acct.pw_name,
                    env={"PYTHONPATH": str(SRC), **env} if "PYTHONPATH" not in env else env,
                    cwd="/tmp")


def wait_done(c: LocalCluster, jobs: list[str], timeout: float) -> bool:
    ctl = c.controller
    assert ctl is not None
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(ctl.store.get(j).terminal for j in jobs):
            return True
        time.sleep(0.1)
    return False


def lost_twice(c: LocalCluster, jobs: list[str]) -> dict[str, int]:
    """Jobs not finished; jobs run again after an attempt had finished them (the issue's
    "completed job ran a second time"); restarts (checkpoint and resume, as the policy moves
    jobs: not an error, reported for context)."""
    ctl = c.controller
    assert ctl is not None
    recs = [ctl.store.get(j) for j in jobs]
    twice = 0
    for r in recs:
        atts = ctl.store.attempts(r.id)
        done = [i for i, a in enumerate(atts) if a["status"] == "finished"]
        again = bool(done) and (len(done) > 1 or done[0] < len(atts) - 1)
        twice += again
        if again and os.environ.get("MISO_SECBENCH_DEBUG"):
            print(r.id, r.command[:2], json.dumps(atts), file=sys.stderr)
    return {"lost": sum(r.state != "finished" for r in recs), "twice": twice,
            "restarts": sum(max(0, int(r.attempts or 0) - 1) for r in recs)}


def procs_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid``."""
    out = []
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            status = Path(f"/proc/{e.name}/status").read_text()
        except OSError:
            continue
        fields = dict(ln.split(":", 1) for ln in status.splitlines() if ":" in ln)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            out.append(int(e.name))
    return out


def victims(c: LocalCluster, acct: pwd.struct_passwd, n: int = 3) -> list[tuple[str, float]]:
    jobs = [(submit(c, acct, [USER_PYTHON, "-c", VICTIM]), time.time()) for _ in range(n)]
    jobs.append((submit(c, acct, ["/bin/true"]), time.time()))
    return jobs


def victim_damage(c: LocalCluster, jobs: list[tuple[str, float]],
                  late: float) -> tuple[int, list[str]]:
    """Victim jobs not finished, finished more than ``late`` s after submission, or with
    invalid reports; and why, per job."""
    ctl = c.controller
    assert ctl is not None
    why = []
    for j, _t0 in jobs:
        rec = ctl.store.get(j)
        took = (rec.ended_at or 0) - (rec.submitted_at or 0)
        if rec.state != "finished":
            why.append(f"{j} {rec.state}")
        elif took > late:
            why.append(f"{j} took {took:.1f}s")
        elif (rec.note or "").startswith("reports invalid"):
            why.append(f"{j} {rec.note}")
    return len(why), why


# ---- attacks ------------------------------------------------------------------------------------

HOOK = textwrap.dedent("""\
    import os as _os
    _p = _os.path.join({out!r}, "py-%d-%d" % (_os.getuid(), _os.getpid()))
    with open(_p, "w") as _f:
        _f.write(str(_os.getuid()))
""")
WRITE_HOOKS = textwrap.dedent("""\
    import sys, pathlib
    evil, hook = pathlib.Path(sys.argv[1]), sys.argv[2]
    for name in ("json", "subprocess", "select", "signal", "ctypes", "sitecustomize",
                 "usercustomize", "contextlib", "time"):
        (evil / (name + ".py")).write_text(hook)
""")
PRELOAD_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/so-%d-%d", OUT, (int)getuid(), (int)getpid());
    FILE *f = fopen(p, "w");
    if (f) { fprintf(f, "%d", (int)getuid()); fclose(f); }
}
"""


def _evil_setup(env: Env, acct: pwd.struct_passwd) -> tuple[Path, Path]:
    """The attacker's own directory (as its home would be) and a shared 1777 results one."""
    base = env.tmpdir()
    evil, out = base / "home", base / "out"
    evil.mkdir()
    os.chown(evil, acct.pw_uid, acct.pw_gid)
    out.mkdir()
    os.chmod(out, 0o1777)
    return evil, out


def _escalations(out: Path, uid: int) -> dict[str, int]:
    uids = [int(p.read_text() or -1) for p in out.iterdir()]
    return {"escalations": sum(u != uid for u in uids),
            "hook_runs_as_user": sum(u == uid for u in uids)}


def attack_env_pythonpath(env: Env) -> dict[str, Any]:
    with env.account() as m, cluster(env) as c:
        evil, out = _evil_setup(env, m)
        j1 = submit(c, m, [USER_PYTHON, "-c", WRITE_HOOKS, str(evil), HOOK.format(out=str(out))])
        wait_done(c, [j1], 60)
        j2 = submit(c, m, [USER_PYTHON, "-c", "import json, subprocess"],
                    PYTHONPATH=str(evil), PYTHONSTARTUP=str(evil / "json.py"))
        wait_done(c, [j2], 60)
        return {**_escalations(out, m.pw_uid), **lost_twice(c, [j1, j2])}


def attack_env_ld_preload(env: Env) -> dict[str, Any]:
    if shutil.which("gcc") is None:
        raise RuntimeError("needs gcc")
    with env.account() as m, cluster(env) as c:
        evil, out = _evil_setup(env, m)
        (evil / "p.c").write_text(PRELOAD_C)
        os.chown(evil / "p.c", m.pw_uid, m.pw_gid)
        j1 = submit(c, m, ["/bin/sh", "-c", f'gcc -shared -fPIC -DOUT=\'"{out}"\' -o {evil}/p.so '
                                            f'{evil}/p.c && chmod 755 {evil}/p.so'],
                    PATH="/usr/local/bin:/usr/bin:/bin")
        wait_done(c, [j1], 60)
        j2 = submit(c, m, ["/bin/sh", "-c", "true"], LD_PRELOAD=str(evil / "p.so"),
                    LD_LIBRARY_PATH=str(evil))
        wait_done(c, [j2], 60)
        return {**_escalations(out, m.pw_uid), **lost_twice(c, [j1, j2])}


GARBAGE = textwrap.dedent("""\
    import json, os, random, sys, time
    p = os.environ["MISO_PROGRESS_FILE"]
    bad = [b'{"time": "x", "iteration": 1, "total": 10, "helper": true}',
           b'{"time": [1], "iteration": 1}', b'{"time": NaN, "iteration": Infinity}',
           b'{"time": 1, "iteration": 1e400}', b'[' * 50000 + b']' * 50000,
           b'{"checkpoint": {"iteration": 1, "path": "a\\\\u0000b"}, "helper": 1}',
           b'\\xff\\xfe\\x00garbage', b'[1, 2, 3]', b' ' * (2 << 20) + b'{}']
    t_end = time.time() + float(sys.argv[1])
    i = 0
    while time.time() < t_end:
        tmp = p + ".tmp"
        for f in (tmp,):
            try:
                os.unlink(f)
            except OSError:
                pass
        k = i % (len(bad) + 3)
        if k < len(bad):
            open(tmp, "wb").write(bad[k])
        elif k == len(bad):
            open(tmp, "wb").write(random.randbytes(random.randint(0, 4096)))
        elif k == len(bad) + 1:
            os.mkfifo(tmp)
        else:
            os.symlink("/dev/zero", tmp)
        os.replace(tmp, p)
        i += 1
        time.sleep(0.05)
""")


def attack_progress_garbage(env: Env) -> dict[str, Any]:
    with env.account() as m, env.account() as v, cluster(env) as c:
        ctl = c.controller
        assert ctl is not None
        bad = submit(c, m, [USER_PYTHON, "-c", GARBAGE, "4"])
        vic = victims(c, v)
        shown = False
        deadline = time.time() + env.opts.late + 30
        while time.time() < deadline and not all(ctl.store.get(j).terminal
                                                 for j in [bad, *(x for x, _ in vic)]):
            shown = shown or ctl.store.get(bad).note.startswith("reports invalid")
            time.sleep(0.1)
        n, why = victim_damage(c, vic, env.opts.late)
        return {"affected": n, "affected_why": why, "invalid_shown": int(shown),
                **lost_twice(c, [bad, *(x for x, _ in vic)])}


def attack_checkpoint_record(env: Env) -> dict[str, Any]:
    d = env.tmpdir() / "ck"
    rec = d / ".miso" / LAST_CHECKPOINT
    variants: list[Callable[[], None]] = [
        lambda: os.mkfifo(rec), lambda: os.symlink("/dev/zero", rec),
        lambda: rec.write_bytes(b'{"path": "/x\\u0000y", "iteration": 3}'),
        lambda: rec.write_bytes(b'{"path": "/tmp", "iteration": "3"}'),
        lambda: rec.write_bytes(b'{"path": 7}'), lambda: rec.write_bytes(b"[" * 100000),
        lambda: rec.write_bytes(b'{"path": "/tmp", "iteration": 1e999}'),
        lambda: rec.write_bytes(os.urandom(3000)),
    ]
    affected = 0
    for make in variants:
        shutil.rmtree(d, ignore_errors=True)
        rec.parent.mkdir(parents=True)
        make()
        box: list[Any] = []

        def call(box: list[Any] = box) -> None:
            try:
                box.append(resume_point(None, None, d))
            except Exception as e:  # noqa: BLE001 - counted
                box.append(e)

        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(5)
        if t.is_alive():
            affected += 1
            with contextlib.suppress(OSError):  # unblock the reader
                os.close(os.open(rec, os.O_WRONLY | os.O_NONBLOCK))
        elif isinstance(box[0], Exception):
            affected += 1
    return {"affected": affected, "variants": len(variants)}


FLOOD = textwrap.dedent("""\
    import os, sys
    line = (b"x" * 1023 + b"\\n") * 64
    for _ in range(int(sys.argv[1]) * 16):
        os.write(1, line)
    os.write(1, b"the end\\n")
""")


def rss_kib() -> int:
    for ln in Path("/proc/self/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1])
    return 0


def attack_log_flood(env: Env) -> dict[str, Any]:
    with env.account() as m, env.account() as v, cluster(env) as c:
        ctl = c.controller
        assert ctl is not None
        rss0 = rss_kib()
        bad = submit(c, m, [USER_PYTHON, "-c", FLOOD, str(env.opts.flood_mb)])
        vic = victims(c, v)
        wait_done(c, [bad, *(x for x, _ in vic)], env.opts.late + 120)
        logs = list((c.dir / "agents").glob(f"*/jobs/{bad}/attempt-*/output.log"))
        size = max((p.stat().st_size for p in logs), default=0)
        agent = next(iter(c.transport.agents().values()))
        cap = getattr(agent, "log_cap", 0)  # 0: an agent without a cap (before issue 15)
        tracemalloc.start()
        t0 = time.perf_counter()
        text = ctl.logs(bad, 3)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        n, why = victim_damage(c, vic, env.opts.late)
        return {"affected": n, "affected_why": why,
                "over_cap": int(cap > 0 and size > cap + 200), "log_mib": round(size / 2**20, 1),
                "cap_mib": round(cap / 2**20, 1), "tail_ms": round(took * 1000, 1),
                "tail_peak_mib": round(peak / 2**20, 2),
                "rss_growth_mib": round((rss_kib() - rss0) / 1024, 1),
                "note_shown": int("bytes dropped from the middle" in text),
                "end_shown": int("the end" in text),
                **lost_twice(c, [bad, *(x for x, _ in vic)])}


ESCAPER = textwrap.dedent("""\
    import os, sys, time
    stay = sys.argv[1] == "stay"
    def sleeper():
        os.execv("/bin/sleep", ["sleep", "1000"])
    if os.fork() == 0:
        os.setsid()
        sleeper()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            sleeper()
        os._exit(0)
    time.sleep(1.0)
    print("spawned", flush=True)
    if stay:
        time.sleep(1000)
""")


def _escape(env: Env, how: str) -> dict[str, Any]:
    with env.account() as m:
        counts: dict[str, Any] = {}
        with cluster(env) as c:
            ctl = c.controller
            assert ctl is not None
            j = submit(c, m, [USER_PYTHON, "-c", ESCAPER, "go" if how == "exit" else "stay"])
            deadline = time.time() + 60
            while time.time() < deadline and len(procs_of(m.pw_uid)) < 3:
                time.sleep(0.05)
            counts["spawned"] = len(procs_of(m.pw_uid))
            if how == "cancel":
                ctl.cancel(j)
            elif how == "exit":
                wait_done(c, [j], 60)
                counts.update(lost_twice(c, [j]))
            elif how == "fence":
                c.crash_controller()  # nobody renews the lease: the guard fences the job
                time.sleep(CFG["lease_s"] + 1)
            if how != "down":
                time.sleep(2)
                counts["outliving"] = len(procs_of(m.pw_uid))
        if how == "down":  # the cluster closed: agent.shutdown
            time.sleep(2)
            counts["outliving"] = len(procs_of(m.pw_uid))
        return counts


def builtin_attacks() -> dict[str, Attack]:
    return {"env-pythonpath": attack_env_pythonpath, "env-ld-preload": attack_env_ld_preload,
            "progress-garbage": attack_progress_garbage,
            "checkpoint-record": attack_checkpoint_record, "log-flood": attack_log_flood,
            **{f"escape-{h}": (lambda env, h=h: _escape(env, h))
               for h in ("cancel", "exit", "fence", "down")}}


def _module(name: str) -> Any:
    """``benchmarks/security/<name>.py`` as a module, or None when it is not there."""
    path = Path(__file__).with_name(f"{name}.py")
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"miso_security_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def all_attacks() -> dict[str, Attack]:
    """The built-in attacks, then those of ``control_plane.py`` and ``trust_attacks.py``
    (issue 26) if they are there."""
    attacks = builtin_attacks()
    for name in ("control_plane", "trust_attacks"):
        mod = _module(name)
        if mod is not None:
            attacks.update(mod.attacks())
    return attacks


def suite(name: str) -> list[str] | None:
    """The attacks of a named suite (``issue26``: ``trust_attacks.py``'s); None: all."""
    if name == "issue26":
        mod = _module("trust_attacks")
        return list(mod.attacks()) if mod is not None else []
    return None


#: Counts that must be 0 besides :data:`STANDARD` (issue 26's targets; ``trust_attacks``).
TARGETS = ("root_writes", "unstopped", "leaks", "quota_overruns", "held", "accepted_hostile",
           "loop_deaths")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3, help="trials of each attack")
    ap.add_argument("--attacks", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--suite", choices=("all", "issue26"), default="all",
                    help="issue26: the attacks of issue 26 only (trust_attacks.py)")
    ap.add_argument("--flood-mb", type=int, default=256, help="MB the log-flood job writes")
    ap.add_argument("--late", type=float, default=30.0,
                    help="a victim job finishing later than this after submission is affected")
    ap.add_argument("--json", default=None, help="write every trial and the summary here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root: the attacks use real Unix accounts", file=sys.stderr)
        return 2
    attacks = all_attacks()
    names = a.attacks.split(",") if a.attacks else (suite(a.suite) or list(attacks))
    unknown = [n for n in names if n not in attacks]
    if unknown:
        print(f"unknown attacks: {', '.join(unknown)}; known: {', '.join(attacks)}",
              file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    summary: dict[str, dict[str, Any]] = {}
    t_start = time.time()
    for name in names:
        tot: dict[str, Any] = {k: 0 for k in STANDARD} | {"trials": 0, "errors": 0}
        for trial in range(a.trials):
            env = Env(trial, a)
            t0 = time.time()
            try:
                counts = attacks[name](env)
            except Exception as e:  # noqa: BLE001 - reported, the other attacks go on
                counts = {"errors": 1, "error": f"{type(e).__name__}: {e}"}
            finally:
                env.close()
            row = {"attack": name, "trial": trial, "wall_s": round(time.time() - t0, 1),
                   **counts}
            rows.append(row)
            print(json.dumps(row), flush=True)
            tot["trials"] += 1
            for k, v in counts.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    key = f"max_{k}" if k in MAXED else k
                    tot[key] = max(tot.get(key, v), v) if k in MAXED else tot.get(k, 0) + v
        summary[name] = tot
    out = {"summary": summary, "wall_s": round(time.time() - t_start)}
    print(json.dumps(out), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"trials": rows, **out}, indent=1))
    bad = sum(t.get(k, 0) for t in summary.values() for k in (*STANDARD, *TARGETS, "errors"))
    for name, key in (("baseline-old-temp-dir", "baseline_root_writes"),
                      ("baseline-noncheckpointing-hold", "baseline_held")):
        base = summary.get(name)  # without the fix the attack must work, or it is not real
        bad += int(base is not None and base.get(key, 0) < base["trials"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
