"""A job's environment never reaches a root process; a job's processes end with it, even
those that left its process group; a job's log is capped and read from its end.

Run as root (as the CI does) these use real, throw-away Unix accounts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from accounts import unix_account
from waiting import wait_for

from miso.agent import Agent
from miso.backend import EmulatedBackend

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
#: A Python any account can run (the test's own may live under /root).
USER_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


@pytest.fixture
def state() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="miso-sec-"))  # under /tmp: jobs' accounts reach it
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_agent(state: Path, **kw: object) -> Agent:
    agent = Agent("node0", EmulatedBackend(1, "A100-40GB"), state / "agent", **kw)
    assert agent.apply_layout(0, [[0, "7g.40gb"]])["ok"]
    return agent


def launch(agent: Agent, state: Path, job: str, command: list[str], *, env: dict | None = None,
           owner: str | None = None, unix_user: str | None = None) -> dict:
    return agent.launch({"job": job, "attempt": 1, "command": command, "gpu": 0,
                         "placement": [0, "7g.40gb"], "mps_pct": None,
                         "checkpoint_dir": str(state / "ck" / job), "resume_from": None,
                         "env": env or {}, "cwd": "/", "owner": owner, "unix_user": unix_user})


def ended(agent: Agent, job: str) -> dict | None:
    rep = [a for a in agent.report()["jobs"] if a["job"] == job]
    return rep[0] if rep and rep[0]["status"] != "running" else None


# ---- item 1: no root from a job's environment ----------------------------------------------

HOOK = textwrap.dedent("""\
    import os as _os
    _p = _os.path.join({out!r}, "py-%d-%d" % (_os.getuid(), _os.getpid()))
    with open(_p, "w") as _f:
        _f.write(str(_os.getuid()))
""")
PRELOAD = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/so-%d-%d", OUT, (int)getuid(), (int)getpid());
    FILE *f = fopen(p, "w");
    if (f) { fprintf(f, "%d", (int)getuid()); fclose(f); }
}
"""


def evil_dir(root: Path) -> tuple[Path, Path, Path]:
    """A user's directory of hooks: Python modules that shadow the stdlib, and an LD_PRELOAD
    library; each records the uid it ran as in ``out/``."""
    evil, out = root / "evil", root / "out"
    evil.mkdir()
    out.mkdir()
    os.chmod(out, 0o1777)
    for name in ("json", "subprocess", "select", "ctypes", "sitecustomize", "usercustomize"):
        (evil / f"{name}.py").write_text(HOOK.format(out=str(out)))
    src = root / "p.c"
    src.write_text(PRELOAD)
    so = evil / "p.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DOUT="{out}"', "-o", str(so), str(src)],
                   check=True)
    for p in (root, evil, *evil.iterdir()):
        os.chmod(p, 0o755)
    return evil, so, out


def uids_seen(out: Path) -> set[int]:
    return {int(p.read_text() or -1) for p in out.iterdir()}


@root_only
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_jobs_environment_never_runs_code_as_root(state: Path) -> None:
    evil, so, out = evil_dir(state)
    agent = make_agent(state)
    with unix_account() as acct:
        env = {"PYTHONPATH": str(evil), "LD_PRELOAD": str(so), "LD_LIBRARY_PATH": str(evil),
               "PYTHONSTARTUP": str(evil / "json.py")}
        r = launch(agent, state, "evil", [USER_PYTHON, "-c", "import json; print('job ran')"],
                   env=env, owner="mallory", unix_user=acct.pw_name)
        assert r["ok"], r
        rep = wait_for(lambda: ended(agent, "evil"))
        seen = uids_seen(out)
        # nothing ran the user's code as root ...
        assert 0 not in seen, sorted(p.name for p in out.iterdir())
        # ... and the job itself, as its owner, did get the variables (that is allowed)
        assert rep["status"] == "finished", agent.logs("evil")
        assert "job ran" in agent.logs("evil")
        assert acct.pw_uid in seen, (seen, agent.logs("evil"))
    agent.shutdown()


def test_job_env_names_and_sizes_are_checked(state: Path) -> None:
    agent = make_agent(state)
    for i, bad in enumerate([{"A=B": "x"}, {"1X": "x"}, {"X": "a\0b"}, {"": "x"},
                             {f"V{i}": "x" for i in range(600)}, {"X": "y" * (2 << 20)}]):
        r = launch(agent, state, f"bad{i}", ["/bin/true"], env=bad)
        assert not r["ok"] and ("environment" in r["error"] or "NUL" in r["error"]), r
    agent.shutdown()


# ---- item 4: a job's processes are a set, not a group ---------------------------------

ESCAPER = textwrap.dedent("""\
    import os, sys, time
    marker, stay = sys.argv[1], sys.argv[2] == "stay"
    def sleeper():
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)",
                                  marker + "-s"])
    if os.fork() == 0:          # leaves the process group: a new session
        os.setsid()
        sleeper()
    if os.fork() == 0:          # double fork: the grandchild is orphaned, in its own session
        os.setsid()
        if os.fork() == 0:
            sleeper()
        os._exit(0)
    def count():
        n = 0
        for p in os.listdir("/proc"):
            try:
                argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")
                n += (marker + "-s").encode() in argv
            except OSError:
                pass
        return n
    while count() < 2:
        time.sleep(0.05)
    print("spawned", flush=True)
    if stay:
        time.sleep(1000)
""")


def marked(marker: str) -> list[int]:
    """Live processes with an argument that starts with ``marker``."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
                st = (p / "stat").read_text().rpartition(")")[2].split()[0]
            except OSError:
                continue
            if any(a.startswith(marker.encode()) for a in argv) and st != "Z":
                out.append(int(p.name))
    return out


@pytest.fixture
def marker() -> Iterator[str]:
    m = f"miso-escaper-{os.getpid()}-{time.monotonic_ns()}"
    yield m
    for pid in marked(m):  # whatever a failed test left behind
        os.kill(pid, signal.SIGKILL)


def start_escaper(agent: Agent, state: Path, job: str, marker: str, stay: bool,
                  unix_user: str | None = None) -> None:
    script = state / "escaper.py"
    script.write_text(ESCAPER)
    os.chmod(script, 0o644)
    r = launch(agent, state, job, [USER_PYTHON if unix_user else sys.executable, str(script),
                                   marker,
                                   "stay" if stay else "go"],
               owner="u" if unix_user else None, unix_user=unix_user)
    assert r["ok"], r
    if stay:
        wait_for(lambda: "spawned" in agent.logs(job))
        assert len(marked(marker + "-s")) == 2, agent.logs(job)


def test_cancel_ends_processes_that_left_the_group(state: Path, marker: str) -> None:
    agent = make_agent(state)
    start_escaper(agent, state, "esc", marker, stay=True)
    assert agent.kill("esc", 1)
    assert wait_for(lambda: ended(agent, "esc"))["status"] == "killed"
    assert marked(marker) == []
    agent.shutdown()


def test_a_job_that_exits_leaves_no_process_behind(state: Path, marker: str) -> None:
    agent = make_agent(state)
    start_escaper(agent, state, "esc", marker, stay=False)
    assert wait_for(lambda: ended(agent, "esc"))["status"] == "finished"
    assert "spawned" in agent.logs("esc")
    wait_for(lambda: marked(marker) == [], timeout=5)
    agent.shutdown()


@root_only
def test_fencing_ends_every_process_of_a_users_job(state: Path, marker: str) -> None:
    agent = make_agent(state)
    with unix_account() as acct:
        agent.renew_lease(time.time() + 30)
        start_escaper(agent, state, "esc", marker, stay=True, unix_user=acct.pw_name)
        agent.renew_lease(time.time() - 1)  # the controller's lease ran out: fence
        assert wait_for(lambda: ended(agent, "esc"))["status"] == "fenced"
        assert marked(marker) == []
    agent.shutdown()


def test_shutdown_ends_every_process(state: Path, marker: str) -> None:
    agent = make_agent(state)
    start_escaper(agent, state, "esc", marker, stay=True)
    agent.shutdown()
    assert marked(marker) == []


# ---- item 5: capped logs, read from the end ----------------------------------------------

def test_a_log_is_capped_keeping_head_and_tail(state: Path) -> None:
    agent = make_agent(state, log_cap_mb=1)
    script = "import sys\nfor i in range(60000): print(f'line {i:06d} ' + 'x' * 40)\n"
    r = launch(agent, state, "loud", [sys.executable, "-c", script])
    assert r["ok"], r
    assert wait_for(lambda: ended(agent, "loud"))["status"] == "finished"
    log = state / "agent" / "jobs" / "loud" / "attempt-1" / "output.log"
    assert log.stat().st_size <= 1 << 20
    text = log.read_text()
    assert text.startswith("line 000000 ") and "line 059999 " in text
    out = agent.logs("loud", tail=3).splitlines()
    assert out[1].startswith("[miso: ") and "bytes dropped from the middle of this log; cap 1 MiB" \
        in out[1], out
    dropped = int(out[1].split()[1])
    assert dropped == 60000 * 53 - (log.stat().st_size - 100), (dropped, log.stat().st_size)
    assert out[-1].startswith("line 059999 ") and len(out) == 5
    agent.shutdown()


def test_logs_tail_reads_the_end_without_loading_the_file(state: Path) -> None:
    agent = make_agent(state)
    r = launch(agent, state, "big", ["/bin/true"])
    assert r["ok"]
    wait_for(lambda: ended(agent, "big"))
    log = state / "agent" / "jobs" / "big" / "attempt-1" / "output.log"
    block = b"".join(b"%07d spam spam spam spam spam spam\n" % i for i in range(25000))
    with open(log, "ab") as f:
        for _ in range(64):  # ~56 MB, written as a job would (the agent's cap is not at play)
            f.write(block)
        f.write(b"the end\n")
    tracemalloc.start()
    try:
        out = agent.logs("big", tail=3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.splitlines()[-3:] == ["0024998 spam spam spam spam spam spam",
                                     "0024999 spam spam spam spam spam spam", "the end"]
    assert peak < 4 << 20, peak
    agent.shutdown()


def cgroup2_writable() -> bool:
    from miso.agent import guard
    home = guard.own_cgroup()
    if home is None or os.geteuid() != 0:
        return False
    probe = os.path.join(home, f"miso-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
        return True
    except OSError:
        return False


HIDER = textwrap.dedent("""\
    import os, sys, time
    marker = sys.argv[1]
    if os.fork() == 0:          # own session, no environment (no MISO_ATTEMPT_TOKEN)
        os.setsid()
        if os.fork() == 0:
            os.execve("/bin/sleep", [marker + "-s", "1000"], {})
        os._exit(0)
    time.sleep(1000)
""")


@pytest.mark.skipif(not cgroup2_writable(), reason="needs a writable cgroup v2 (and root)")
def test_the_cgroup_holds_what_the_guard_and_the_token_cannot(state: Path, marker: str) -> None:
    """The job's processes sit in the attempt's cgroup: one that double-forked and cleared its
    environment is still killed when its guard is gone (SIGKILLed)."""
    agent = make_agent(state)
    script = state / "hider.py"
    script.write_text(HIDER)
    r = launch(agent, state, "hide", [sys.executable, str(script), marker])
    assert r["ok"], r
    sleeper = wait_for(lambda: marked(marker + "-s"))[0]
    cg = Path(f"/proc/{sleeper}/cgroup").read_text()
    assert f"/miso-{r['pid']}\n" in cg, cg
    os.kill(r["pid"], signal.SIGKILL)  # the guard is gone: no subreaper any more
    wait_for(lambda: ended(agent, "hide"))
    assert marked(marker + "-s") == [sleeper]  # orphaned, outside the group and the token
    agent.kill("hide", 1)
    assert marked(marker + "-s") == []
    from miso.agent import guard
    assert not os.path.exists(os.path.join(guard.own_cgroup() or "/nonexistent",
                                           f"miso-{r['pid']}"))
    agent.shutdown()


@root_only
def test_without_a_cgroup_the_subreaper_guard_ends_every_process(state: Path,
                                                                 marker: str) -> None:
    """The documented fallback: a guard that cannot create a cgroup (here it runs as an
    unprivileged account) still ends, on SIGHUP, the processes that left the job's group."""
    from miso.agent import guard

    script = state / "escaper.py"
    script.write_text(ESCAPER)
    env_file = state / "env.json"
    with unix_account() as acct:
        env_file.write_text('{"PATH": "/usr/bin:/bin"}')
        own = state / "own"
        own.mkdir()
        for f in (env_file, own):
            os.chown(f, acct.pw_uid, acct.pw_gid)
        log = own / "guard.log"
        p = subprocess.Popen([USER_PYTHON, "-I", "-S", guard.__file__, "--env-file",
                              str(env_file), "--log", str(log), "--", USER_PYTHON, str(script),
                              marker, "stay"], user=acct.pw_uid, group=acct.pw_gid,
                             cwd="/", start_new_session=True)
        try:
            wait_for(lambda: log.exists() and "spawned" in log.read_text())
            assert len(marked(marker + "-s")) == 2
            assert not any(f"miso-{p.pid}" in Path(f"/proc/{pid}/cgroup").read_text()
                           for pid in marked(marker + "-s"))  # no cgroup: the fallback
            p.send_signal(signal.SIGHUP)
            assert p.wait(10) == 137
            assert marked(marker) == []
        finally:
            p.kill()


def test_a_leftover_that_keeps_writing_does_not_hold_the_job_open(state: Path) -> None:
    agent = make_agent(state, log_cap_mb=1)
    r = launch(agent, state, "chatty", ["/bin/sh", "-c", "(setsid yes spam &) ; sleep 0.3"])
    assert r["ok"], r
    assert wait_for(lambda: ended(agent, "chatty"))["status"] == "finished"
    assert agent.running_pids() == []
    agent.shutdown()
