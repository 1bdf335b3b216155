"""The CLI through the HTTP API, against a real controller on emulated GPUs (no Ray): the
operator's bootstrap, users and tokens, `miso login`, jobs of two users, credentials lookup."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import CLIENT_ENV, FAST, run_cli, served_cluster
from waiting import wait_for

from miso.agent import runas
from miso.api.credentials import Credentials, resolve, save_login
from miso.controller import ControllerConfig


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME and no credentials from the environment."""
    for k in CLIENT_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def cluster(home: Path) -> Iterator[tuple[Path, str]]:
    """A live controller with its API, as the head serves them; (state dir, URL)."""
    with served_cluster(ControllerConfig(**FAST), "miso-cli-") as served:
        yield served


miso = run_cli


def test_two_users_through_the_cli(cluster: tuple[Path, str], home: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sd, url = cluster
    monkeypatch.chdir("/")  # the jobs run here: a directory alice's account can enter
    op = {"MISO_STATE_DIR": str(sd)}  # the operator on the head: url and token from there
    r = miso("user", "add", "alice", "--unix-user", "nobody", **op)
    assert r.exit_code == 0, r.output
    alice = r.stdout.strip().splitlines()[-1]
    assert alice.startswith("miso_")
    r = miso("user", "list", "--json", **op)
    assert {u["name"]: u["unix_user"] for u in json.loads(r.stdout)}["alice"] == "nobody"
    # alice logs in from "another shell": only her config, no state dir
    cfg = home / "alice.json"
    r = miso("login", "--url", url, "--token", alice, MISO_CONFIG=str(cfg))
    assert r.exit_code == 0 and "as alice" in r.stdout, r.output
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    me = {"MISO_CONFIG": str(cfg)}
    r = miso("submit", "--name", "hello", "--env", "GREETING=hi there", "--",
             "/bin/sh", "-c", 'id -u; echo "$GREETING"', **me)
    assert r.exit_code == 0, r.output
    jid = r.stdout.strip()
    st = wait_for(lambda: (s := json.loads(miso("status", "--json", **me).stdout))
                  ["jobs"][0]["state"] == "finished" and s, timeout=60)
    assert st["api_url"] == url and st["user"] == "alice"
    out = miso("logs", "hello", **me).stdout
    assert "hi there" in out
    if os.geteuid() == 0:
        assert "65534" in out  # ran as alice's Unix account
    # the operator's job: alice sees it as a count, cannot cancel or read it
    r = miso("submit", "--name", "secret", "--", "sleep", "30", **op)
    other = r.stdout.strip()
    st = json.loads(miso("status", "--json", **me).stdout)
    assert [j["id"] for j in st["jobs"]] == [jid] and "secret" not in json.dumps(st)
    r = miso("cancel", other, **me)
    assert r.exit_code == 2 and "belongs to another user" in r.output
    assert miso("logs", other, **me).exit_code == 2
    assert miso("user", "list", **me).exit_code == 2
    # alice rotates her token: the config follows, the old token is dead
    r = miso("user", "rotate", "alice", **me)
    assert r.exit_code == 0, r.output
    new = r.stdout.strip().splitlines()[-1]
    assert json.loads(cfg.read_text())["token"] == new != alice
    r = miso("status", "--url", url, "--token", alice)
    assert r.exit_code == 2 and "invalid token" in r.output
    assert miso("status", **me).exit_code == 0
    r = miso("cancel", other, **op)
    assert r.exit_code == 0 and "cancelled" in r.stdout
    audit = [(e["user"], e["action"]) for e in __import__("httpx").get(
        url + "/api/v1/audit", headers={"Authorization": "Bearer " + (
            sd / "operator.token").read_text().strip()}).json()["audit"]]
    assert ("alice", "submit") in audit and audit[-1][1] == "cancel"
    r = miso("user", "remove", "alice", **op)
    assert r.exit_code == 0
    r = miso("status", **me)
    assert r.exit_code == 2 and "invalid token" in r.output


def test_user_commands_follow_login_and_env_like_every_client(
        cluster: tuple[Path, str], home: Path) -> None:
    """`miso user add` of a logged-in admin goes to the cluster (no local database appears);
    a non-admin is refused, not told "added"."""
    sd, url = cluster
    op_token = (sd / "operator.token").read_text().strip()
    assert miso("login", "--url", url, "--token", op_token).exit_code == 0
    r = miso("user", "add", "carol", "--admin")
    assert r.exit_code == 0, r.output
    carol = r.stdout.strip().splitlines()[-1]
    r = miso("user", "add", "dave")  # not an admin: allowed through the API for an admin
    assert r.exit_code == 0, r.output
    dave = r.stdout.strip().splitlines()[-1]
    assert not (home / ".miso" / "cluster" / "users.db").exists()
    names = {u["name"] for u in json.loads(miso("user", "list", "--json").stdout)}
    assert {"carol", "dave"} <= names
    # MISO_URL/MISO_TOKEN, as for `miso status`: carol (an admin) adds erin
    r = miso("user", "add", "erin", MISO_URL=url, MISO_TOKEN=carol)
    assert r.exit_code == 0, r.output
    # a non-admin gets a refusal and exit 2, and nothing is added anywhere
    r = miso("user", "add", "mallory", "--admin", MISO_URL=url, MISO_TOKEN=dave)
    assert r.exit_code == 2 and "not an admin" in r.output and "added" not in r.output
    names = {u["name"] for u in json.loads(miso("user", "list", "--json").stdout)}
    assert "erin" in names and "mallory" not in names
    assert not (home / ".miso" / "cluster" / "users.db").exists()


def test_a_multi_user_submit_runs_the_program_the_submitters_shell_finds(
        cluster: tuple[Path, str], home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`-- mytool` runs the program on the submitter's PATH (sent as an absolute path), even
    under an account whose standard PATH lacks it; a bare name the account cannot find is
    refused at submit time with the fix."""
    sd, url = cluster
    monkeypatch.chdir("/")
    bindir = Path(tempfile.mkdtemp(prefix="miso-bin-"))  # under /tmp: any account reaches it
    try:
        bindir.chmod(0o755)
        tool = bindir / "miso-test-tool"
        tool.write_text("#!/bin/sh\necho tool ran as $(id -u)\n")
        tool.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
        op = {"MISO_STATE_DIR": str(sd)}
        alice = miso("user", "add", "alice", "--unix-user", "nobody", **op).stdout.split()[-1]
        me = {"MISO_URL": url, "MISO_TOKEN": alice}
        r = miso("submit", "--name", "t", "--", "miso-test-tool", **me)
        assert r.exit_code == 0, r.output
        st = wait_for(lambda: (s := json.loads(miso("status", "--json", **me).stdout))
                      ["jobs"][0]["state"] in ("finished", "failed") and s, timeout=60)
        job = st["jobs"][0]
        assert job["command"] == [str(tool)]
        assert job["state"] == "finished", job
        assert "tool ran as" in miso("logs", "t", **me).stdout
        if os.geteuid() == 0:
            # a direct API client sending a bare name the job's account would not find
            resp = __import__("httpx").post(
                url + "/api/v1/jobs", json={"command": ["miso-test-tool"]},
                headers={"Authorization": f"Bearer {alice}"})
            assert resp.status_code == 400, resp.text
            assert "absolute path" in resp.text and str(runas.DEFAULT_PATH) in resp.text
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


def test_first_user_is_made_by_the_local_operator(home: Path, tmp_path: Path) -> None:
    sd = tmp_path / "state"
    r = miso("user", "add", "bob", "--state-dir", str(sd))
    assert r.exit_code == 2 and "first user must be an admin" in r.output
    r = miso("user", "add", "boss", "--admin", "--state-dir", str(sd))
    assert r.exit_code == 0 and r.stdout.strip().startswith("miso_")
    assert stat.S_IMODE((sd / "users.db").stat().st_mode) == 0o600
    assert stat.S_IMODE(sd.stat().st_mode) == 0o700
    # from now on adding a user needs an admin token through the API
    r = miso("user", "add", "carl", "--state-dir", str(sd))
    assert r.exit_code == 2 and "no miso cluster found" in r.output


def test_no_cluster_and_no_token_are_one_line_errors(home: Path, tmp_path: Path) -> None:
    r = miso("status")
    assert r.exit_code == 2 and "no miso cluster found" in r.output
    r = miso("status", "--url", "http://127.0.0.1:1")
    assert r.exit_code == 2 and "no token" in r.output
    r = miso("status", "--url", "http://127.0.0.1:1", "--token", "x")
    assert r.exit_code == 2 and "cannot reach the miso API" in r.output
    r = miso("submit", "--env", "1BAD=x", "--", "true", "--url", "http://127.0.0.1:1")
    assert r.exit_code == 2


def test_credentials_precedence(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                ) -> None:
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "api.json").write_text(json.dumps({"url": "http://127.0.0.1:7"}))
    (sd / "operator.token").write_text("tok-op\n")
    monkeypatch.setenv("MISO_CONFIG", str(tmp_path / "cfg.json"))
    save_login("https://head:8443", "tok-login", "/ca.pem")
    default = tmp_path / "nothing"
    got = resolve(url=None, token=None, state_dir=None, default_state_dir=default)
    assert got == Credentials("https://head:8443", "tok-login", "/ca.pem")
    got = resolve(url=None, token=None, state_dir=str(sd), default_state_dir=default)
    assert got == Credentials("http://127.0.0.1:7", "tok-op", None)
    got = resolve(url=None, token=None, state_dir=None, default_state_dir=sd)
    assert got.token == "tok-login"  # a login beats the default state dir
    monkeypatch.setenv("MISO_URL", "http://other:1")
    got = resolve(url=None, token=None, state_dir=None, default_state_dir=sd)
    assert got == Credentials("http://other:1", None, None)  # no token sent elsewhere
    monkeypatch.setenv("MISO_TOKEN", "tok-env")
    got = resolve(url="http://flag:2", token=None, state_dir=None, default_state_dir=sd)
    assert got == Credentials("http://flag:2", "tok-env", None)


def test_cluster_up_refuses_plain_http_off_loopback(home: Path, tmp_path: Path) -> None:
    sd = str(tmp_path / "st")
    r = miso("cluster", "up", "--emulated", "--listen", "0.0.0.0:8443", "--state-dir", sd)
    assert r.exit_code == 2 and "without TLS" in r.output
    r = miso("cluster", "up", "--emulated", "--listen", "127.0.0.1:x", "--state-dir", sd)
    assert r.exit_code == 2 and "HOST:PORT" in r.output
    r = miso("cluster", "up", "--emulated", "--listen", "0.0.0.0:8443", "--tls-cert",
             str(tmp_path / "none.pem"), "--tls-key", str(tmp_path / "none.key"),
             "--state-dir", sd)
    assert r.exit_code == 2 and "no such file" in r.output
    assert not (tmp_path / "st" / "cluster.json").exists()


def test_env_all_passes_the_shell_without_miso_and_ray_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from miso.cli.client import parse_env

    monkeypatch.setenv("MISO_TOKEN", "secret")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret")
    monkeypatch.setenv("BASH_FUNC_f%%", "() { :; }")
    monkeypatch.setenv("MY_VAR", "1")
    env = parse_env(["A=b=c", "MY_VAR=2"], env_all=True)
    assert env["A"] == "b=c" and env["MY_VAR"] == "2" and env["PATH"] == os.environ["PATH"]
    assert not any(k.startswith(("MISO_", "RAY_", "BASH_FUNC")) for k in env)
    assert parse_env(["X=1"], env_all=False) == {"X": "1"}
