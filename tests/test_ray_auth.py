"""A real `miso cluster up --emulated`: Ray runs with token auth and a process without the
cluster's token cannot connect; the state files are private; the API URL is printed and the
CLI works through it for two users; after the controller is killed the API comes back at the
same URL. Slow: Ray takes seconds to start."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROBE = """
import sys, ray
from ray.util import list_named_actors
try:
    ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
    print("CONNECTED", len(list_named_actors(all_namespaces=True)), flush=True)
except Exception as e:
    print("REFUSED", type(e).__name__, flush=True)
"""


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def cli(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    # from "/": a submitted job runs in the caller's directory, which its account must enter
    return subprocess.run([sys.executable, "-m", "miso.cli", *args], env=env, text=True,
                          capture_output=True, timeout=timeout, cwd="/")


@pytest.fixture
def up() -> Iterator[tuple[Path, dict[str, str], str]]:
    sd = Path(tempfile.mkdtemp(prefix="miso-rayauth-")) / "state"
    os.chmod(sd.parent, 0o711)  # jobs' accounts reach the state dir (as under /var/lib)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MISO_"))}
    env |= {"MISO_STATE_DIR": str(sd), "MISO_CONFIG": str(sd.parent / "cfg.json"),
            "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"}
    r = cli("cluster", "up", "--emulated", "--gpus", "1", "--profile-seconds", "0.3", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield sd, env, r.stdout
    finally:
        cli("cluster", "down", env=env, timeout=120)
        shutil.rmtree(sd.parent, ignore_errors=True)


PID = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
h = ray.get_actor("miso-controller", namespace="miso")
print("PID", ray.get(h.pid.remote(), timeout=60), flush=True)
"""


def probe(address: str, env: dict[str, str], user: int | None = None, code: str = PROBE
          ) -> str:
    env = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    try:
        r = subprocess.run([sys.executable, "-c", code, address], env=env, text=True,
                           capture_output=True, timeout=90, user=user)
    except subprocess.TimeoutExpired:
        return "TIMEOUT"  # it never got in
    return r.stdout


def test_real_cluster_ray_token_private_state_two_users_restart(up: tuple) -> None:
    sd, env, out = up
    info = json.loads((sd / "cluster.json").read_text())
    url = json.loads((sd / "api.json").read_text())["url"]
    assert f"miso API at {url}" in out.replace("\n", " ") and url.startswith("http://127.0.0.1:")
    # private state
    assert mode(sd) == 0o700
    for f in ("miso.db", "users.db", "ray_token", "operator.token", "api.json", "head.log",
              "cluster.json"):
        assert mode(sd / f) == 0o600, f
    # Ray: without the token (auth off, or a wrong token) nothing connects; with it, it does
    bare = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    assert "CONNECTED" not in probe(info["address"], {**bare, "RAY_AUTH_MODE": "disabled"})
    assert "CONNECTED" not in probe(info["address"], {**bare, "RAY_AUTH_MODE": "token",
                                                      "RAY_AUTH_TOKEN": "0" * 64})
    good = {**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(sd / "ray_token")}
    assert "CONNECTED" in probe(info["address"], good)
    if os.geteuid() == 0:  # another Unix user cannot read the token
        r = subprocess.run(["/bin/cat", str(sd / "ray_token")], user=65534,
                           capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr
    # the CLI works through the API (the operator's token from the state dir)
    r = cli("submit", "--", "/bin/sh", "-c", "echo via-api", env=env)
    assert r.returncode == 0, r.stderr
    st = json.loads(cli("status", "--json", env=env).stdout)
    assert st["api_url"] == url and st["jobs"][0]["id"] == r.stdout.strip()
    # the README's multi-user set-up: the admin adds alice, she logs in from another shell
    r = cli("user", "add", "alice", "--unix-user", "nobody", env=env)
    assert r.returncode == 0, r.stderr
    alice = {k: v for k, v in env.items() if k != "MISO_STATE_DIR"}
    alice["MISO_CONFIG"] = str(sd.parent / "alice.json")
    r = cli("login", "--url", url, "--token", r.stdout.strip(), env=alice)
    assert r.returncode == 0 and "as alice" in r.stdout, r.stderr
    r = cli("submit", "--name", "hers", "--", "/bin/sh", "-c", "id -u", env=alice)
    assert r.returncode == 0, r.stderr
    deadline = time.time() + 90
    while "finished" not in cli("status", "--json", env=alice).stdout:
        assert time.time() < deadline
        time.sleep(1)
    out = cli("logs", "hers", env=alice).stdout
    assert ("65534" if os.geteuid() == 0 else str(os.geteuid())) in out, out
    r = cli("logs", st["jobs"][0]["id"], env=alice)
    assert r.returncode == 2 and "belongs to another user" in r.stderr
    # the controller process dies: Ray restarts it and the API comes back at the same URL
    pid = int(probe(info["address"], good, code=PID).split()[-1])
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 120
    while True:
        r = cli("status", "--json", env=alice, timeout=60)
        if r.returncode == 0 and json.loads(r.stdout)["jobs"]:
            break
        assert time.time() < deadline, r.stderr
        time.sleep(1)
    assert json.loads((sd / "api.json").read_text())["url"] == url
    assert json.loads(r.stdout)["jobs"][0]["name"] == "hers"
