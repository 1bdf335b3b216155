"""The HTTP API in-process: authentication, authorisation, validation, limits, audit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, Depends
from fastapi.testclient import TestClient

from miso.api import UserStore, create_app, require_user
from miso.api.users import User
from miso.controller import JobStore, StoreError, SubmitError


class StoreController:
    """The controller's public surface over a real job store, without agents (logs and cancel
    act on the store directly)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.cancelled: list[str] = []
        self.ahead: list[str] = []
        self.rooms: list[str] = []

    def submit(self, command: list[str], *, name: str | None = None,
               memory_gb: float | None = None, workload: str | None = None,
               env: dict[str, str] | None = None, cwd: str | None = None,
               owner: str | None = None, unix_user: str | None = None,
               owner_name: str | None = None, request_id: str | None = None,
               ahead: bool = False) -> str:
        if ahead:  # a service replica (the head's own): queued ahead of the others
            self.ahead.append(name or "")
        try:
            return self.store.submit(command=command, name=name, memory_gb=memory_gb or 1.0,
                                     workload=workload, env=env, cwd=cwd, owner=owner,
                                     unix_user=unix_user, owner_name=owner_name,
                                     request_id=request_id).id
        except StoreError as e:
            raise SubmitError(str(e)) from None

    def make_room(self, job: str) -> None:
        self.rooms.append(job)

    def cancel(self, job: str) -> dict[str, Any]:
        rec = self.store.get(job)
        if rec.terminal:
            raise SubmitError(f"job {rec.id} is already {rec.state}")
        self.store.finish(rec.id, "cancelled", reason="cancelled by user", at=1.0)
        self.cancelled.append(rec.id)
        return self.store.get(rec.id).to_json()

    def cluster(self) -> dict[str, Any]:
        active = [r.id for r in self.store.jobs(active_only=True)]
        return {"gpus": [{"id": "node0/0", "model": "A100-40GB", "phase": "mig",
                          "layout": ["3g.20gb@0", "4g.20gb@3"], "jobs": active,
                          "assignment": {j: "3g.20gb@0" for j in active[:1]},
                          "mps_shares": {}}],
                "queue": active[1:],
                "nodes": ["node0"], "time": 1.0, "policy": "miso", "errors": ["boom"]}

    def logs(self, job: str, tail: int = 200) -> str:
        return f"output of {self.store.get(job).id}"


@pytest.fixture
def api(tmp_path: Path) -> Any:
    users = UserStore(tmp_path / "users.db")
    ctl = StoreController(JobStore(tmp_path / "miso.db"))
    tokens = {"admin": users.add("admin", admin=True, unix_user="daemon"),
              "alice": users.add("alice", unix_user="nobody"),
              "bob": users.add("bob")}
    app = create_app(ctl, users, api_url="http://127.0.0.1:1", max_body_bytes=4096,
                     snapshot_ttl=0.0)
    with TestClient(app) as client:
        yield client, tokens, ctl, users


def H(token: str) -> dict[str, str]:  # noqa: N802
    return {"Authorization": f"Bearer {token}"}


ENDPOINTS = [("post", "/api/v1/jobs", {"command": ["true"]}), ("get", "/api/v1/jobs", None),
             ("get", "/api/v1/jobs/j0001", None), ("get", "/api/v1/jobs/j0001/logs", None),
             ("post", "/api/v1/jobs/j0001/cancel", None), ("get", "/api/v1/status", None),
             ("get", "/api/v1/users/me", None), ("get", "/api/v1/users", None),
             ("post", "/api/v1/users", {"name": "carol"}),
             ("delete", "/api/v1/users/bob", None), ("post", "/api/v1/users/bob/rotate", None),
             ("get", "/api/v1/audit", None)]


def test_every_endpoint_needs_a_valid_token(api: Any) -> None:
    client, tokens, _, _ = api
    for method, path, body in ENDPOINTS:
        for headers in ({}, H("miso_wrong"), {"Authorization": "Basic abc"},
                        {"Authorization": f"Bearer {tokens['alice']}x"}):
            r = client.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.text)
            assert "error" in r.json() and r.headers["www-authenticate"] == "Bearer"


def test_another_users_token_is_403_on_every_endpoint_of_theirs(api: Any) -> None:
    client, tokens, ctl, users = api
    bob_job = client.post("/api/v1/jobs", json={"command": ["true"]},
                          headers=H(tokens["bob"])).json()["id"]
    theirs = [("get", f"/api/v1/jobs/{bob_job}", None),
              ("get", f"/api/v1/jobs/{bob_job}/logs", None),
              ("post", f"/api/v1/jobs/{bob_job}/cancel", None),
              ("get", "/api/v1/jobs?all=1", None), ("get", "/api/v1/users", None),
              ("post", "/api/v1/users", {"name": "mallory", "admin": True}),
              ("delete", "/api/v1/users/bob", None), ("post", "/api/v1/users/bob/rotate", None),
              ("get", "/api/v1/audit", None)]
    for method, path, body in theirs:
        r = client.request(method, path, json=body, headers=H(tokens["alice"]))
        assert r.status_code == 403, (method, path, r.text)
        assert set(r.json()) == {"error"}
    assert [u["name"] for u in users.list()] == ["admin", "alice", "bob"]
    assert not ctl.store.get(bob_job).terminal and ctl.cancelled == []
    # what is alice's own answers 200
    for path in ("/api/v1/jobs", "/api/v1/status", "/api/v1/users/me"):
        assert client.get(path, headers=H(tokens["alice"])).status_code == 200


def test_other_users_jobs_are_forbidden_on_every_job_endpoint(api: Any) -> None:
    client, tokens, ctl, _ = api
    r = client.post("/api/v1/jobs", json={"command": ["python", "secret.py"], "name": "train"},
                    headers=H(tokens["bob"]))
    assert r.status_code == 201, r.text
    bob_job = r.json()["id"]
    for method, path in (("get", f"/api/v1/jobs/{bob_job}"),
                         ("get", f"/api/v1/jobs/{bob_job}/logs"),
                         ("post", f"/api/v1/jobs/{bob_job}/cancel")):
        r = client.request(method, path, headers=H(tokens["alice"]))
        assert r.status_code == 403, (path, r.text)
        assert "secret.py" not in r.text
    assert ctl.cancelled == [] and not ctl.store.get(bob_job).terminal
    # a name is looked up among the user's own jobs: alice's "train" is not bob's
    assert client.get("/api/v1/jobs/train", headers=H(tokens["alice"])).status_code == 404
    r = client.post("/api/v1/jobs", json={"command": ["true"], "name": "train"},
                    headers=H(tokens["alice"]))
    assert r.status_code == 201 and r.json()["id"] != bob_job
    assert client.get("/api/v1/jobs/train", headers=H(tokens["alice"])).json()["job"][
        "owner_name"] == "alice"
    # the owner and admins may
    for who in ("bob", "admin"):
        r = client.get(f"/api/v1/jobs/{bob_job}/logs", headers=H(tokens[who]))
        assert r.status_code == 200 and r.json()["text"] == f"output of {bob_job}"
    r = client.post(f"/api/v1/jobs/{bob_job}/cancel", headers=H(tokens["bob"]))
    assert r.status_code == 200 and r.json()["job"]["state"] == "cancelled"
    r = client.post(f"/api/v1/jobs/{bob_job}/cancel", headers=H(tokens["bob"]))
    assert r.status_code == 409 and "already cancelled" in r.json()["error"]


def test_listing_and_status_show_other_users_jobs_as_counts_only(api: Any) -> None:
    client, tokens, _, _ = api
    ids = {}
    for who in ("alice", "bob", "bob"):
        r = client.post("/api/v1/jobs", json={"command": ["echo", f"cmd-of-{who}"]},
                        headers=H(tokens[who]))
        ids.setdefault(who, []).append(r.json()["id"])
    r = client.get("/api/v1/jobs", headers=H(tokens["alice"]))
    assert [j["id"] for j in r.json()["jobs"]] == ids["alice"]
    assert client.get("/api/v1/jobs?all=1", headers=H(tokens["alice"])).status_code == 403
    st = client.get("/api/v1/status", headers=H(tokens["alice"])).json()
    assert "cmd-of-bob" not in str(st) and not any(i in str(st) for i in ids["bob"])
    gpu = st["gpus"][0]
    assert gpu["jobs"] == ids["alice"] and gpu["other_jobs"] == 2
    assert gpu["layout"] == ["3g.20gb@0", "4g.20gb@3"]
    assert st["counts"]["all"] == {"queued": 3} and st["counts"]["mine"] == {"queued": 1}
    assert st["api_url"] == "http://127.0.0.1:1" and "errors" not in st and "queue" not in st
    st = client.get("/api/v1/status", headers=H(tokens["admin"])).json()
    assert len(st["jobs"]) == 3 and st["gpus"][0]["other_jobs"] == 0 and st["errors"]
    assert len(st["queue"]) == 2
    all_jobs = client.get("/api/v1/jobs?all=1", headers=H(tokens["admin"])).json()["jobs"]
    assert {j["owner_name"] for j in all_jobs} == {"alice", "bob"}


def test_submit_passes_owner_and_unix_user_and_is_audited(api: Any) -> None:
    client, tokens, ctl, users = api
    r = client.post("/api/v1/jobs", json={"command": ["true"], "env": {"A": "1"},
                                          "cwd": "/tmp", "memory_gb": 2},
                    headers=H(tokens["alice"]))
    jid = r.json()["id"]
    rec = ctl.store.get(jid)
    assert (rec.owner, rec.owner_name, rec.unix_user, rec.env, rec.cwd) == (
        users.get("alice").id, "alice", "nobody", {"A": "1"}, "/tmp")
    client.post(f"/api/v1/jobs/{jid}/cancel", headers=H(tokens["admin"]))
    log = client.get("/api/v1/audit", headers=H(tokens["admin"])).json()["audit"]
    assert [(e["user"], e["action"], e["job"]) for e in log] == [
        ("alice", "submit", jid), ("admin", "cancel", jid)]
    assert all(e["at"] > 1e9 for e in log)
    assert client.get("/api/v1/audit", headers=H(tokens["alice"])).status_code == 403


def test_malformed_and_oversized_requests_and_the_server_keeps_serving(api: Any) -> None:
    client, tokens, _, _ = api
    bad = [{"command": []}, {"command": "true"}, {"command": ["true"], "memory_gb": -1},
           {"command": ["true"], "name": "bad name!"}, {"command": ["true"], "extra": 1},
           {"command": ["true"], "env": {"BAD-KEY": "x"}}, {"command": ["true"], "cwd": "rel"},
           {"command": ["true"], "env": {"A": 5}}]
    for body in bad:
        r = client.post("/api/v1/jobs", json=body, headers=H(tokens["alice"]))
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error"].startswith("invalid request")
    r = client.post("/api/v1/jobs", content=b"{not json", headers={
        **H(tokens["alice"]), "Content-Type": "application/json"})
    assert r.status_code == 422 and "error" in r.json()
    r = client.post("/api/v1/jobs", json={"command": ["x" * 5000]}, headers=H(tokens["alice"]))
    assert r.status_code == 413 and "4096 bytes" in r.json()["error"]

    def chunks() -> Any:
        for _ in range(10):
            yield b"x" * 1000

    r = client.post("/api/v1/jobs", content=chunks(), headers={
        **H(tokens["alice"]), "Content-Type": "application/json"})
    assert r.status_code == 413
    assert client.get("/api/v1/jobs?limit=0", headers=H(tokens["alice"])).status_code == 422
    assert client.get("/api/v1/nothing", headers=H(tokens["alice"])).json() == {
        "error": "Not Found"}
    r = client.post("/api/v1/jobs", json={"command": ["true"]}, headers=H(tokens["alice"]))
    assert r.status_code == 201


def test_users_admin_only_rotation_and_removal(api: Any) -> None:
    client, tokens, _, _ = api
    assert client.get("/api/v1/users", headers=H(tokens["alice"])).status_code == 403
    r = client.post("/api/v1/users", json={"name": "carol"}, headers=H(tokens["alice"]))
    assert r.status_code == 403
    r = client.post("/api/v1/users", json={"name": "carol", "unix_user": "nobody"},
                    headers=H(tokens["admin"]))
    assert r.status_code == 201 and r.json()["token"].startswith("miso_")
    carol = r.json()["token"]
    me = client.get("/api/v1/users/me", headers=H(carol)).json()
    assert me == {"id": me["id"], "name": "carol", "admin": False, "unix_user": "nobody"}
    assert me["id"].startswith("u:")
    r = client.post("/api/v1/users", json={"name": "carol"}, headers=H(tokens["admin"]))
    assert r.status_code == 409
    names = [u["name"] for u in client.get("/api/v1/users", headers=H(tokens["admin"])).json()[
        "users"]]
    assert names == ["admin", "alice", "bob", "carol"]
    assert "token" not in str(client.get("/api/v1/users", headers=H(tokens["admin"])).json())
    # rotation: the old token stops working; only admins rotate someone else's
    assert client.post("/api/v1/users/bob/rotate", headers=H(carol)).status_code == 403
    new = client.post("/api/v1/users/carol/rotate", headers=H(carol)).json()["token"]
    assert client.get("/api/v1/users/me", headers=H(carol)).status_code == 401
    assert client.get("/api/v1/users/me", headers=H(new)).status_code == 200
    assert client.delete("/api/v1/users/carol", headers=H(tokens["admin"])).status_code == 200
    assert client.get("/api/v1/users/me", headers=H(new)).status_code == 401
    r = client.delete("/api/v1/users/admin", headers=H(tokens["admin"]))
    assert r.status_code == 409 and "last admin" in r.json()["error"]


def test_user_store_keeps_only_hashes(tmp_path: Path) -> None:
    users = UserStore(tmp_path / "u.db")
    token = users.add("dana")
    assert users.authenticate(token) == User("dana", False, None, users.get("dana").id)
    assert users.authenticate(token[:-1]) is None and users.authenticate("") is None
    users.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert token.encode() not in raw
    assert {oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {"0o600"}


def test_extra_routers_mount_and_can_require_a_user(tmp_path: Path) -> None:
    users = UserStore(":memory:")
    token = users.add("eve")
    extra = APIRouter()

    @extra.get("/api/v1/events")
    def events(user: User = Depends(require_user)) -> dict[str, str]:
        return {"user": user.name}

    app = create_app(StoreController(JobStore(":memory:")), users, extra_routers=[extra])
    with TestClient(app) as client:
        assert client.get("/api/v1/events").status_code == 401
        assert client.get("/api/v1/events", headers=H(token)).json() == {"user": "eve"}


def test_server_binds_loopback_by_default_and_refuses_plain_http_outside(tmp_path: Path
                                                                         ) -> None:
    import httpx

    from miso.api.server import ApiServer, ListenError, parse_listen

    assert parse_listen("127.0.0.1:0").host == "127.0.0.1"
    assert parse_listen("8080").host == "127.0.0.1"
    with pytest.raises(ListenError, match="without TLS"):
        parse_listen("0.0.0.0:8443")
    assert parse_listen("0.0.0.0:8443", insecure=True).port == 8443
    assert parse_listen("0.0.0.0:8443", tls_cert="c", tls_key="k").tls
    with pytest.raises(ListenError, match="both"):
        parse_listen("127.0.0.1:1", tls_cert="c")
    with pytest.raises(ListenError, match="HOST:PORT"):
        parse_listen("host:http")
    users = UserStore(":memory:")
    token = users.add("fay")
    srv = ApiServer(create_app(StoreController(JobStore(":memory:")), users),
                    parse_listen("127.0.0.1:0"))
    url = srv.start()
    try:
        assert url.startswith("http://127.0.0.1:")
        r = httpx.get(url + "/api/v1/users/me", headers=H(token), timeout=10)
        assert r.json()["name"] == "fay"
        # oversized and malformed bodies over a real connection; the server goes on
        r = httpx.post(url + "/api/v1/jobs", headers=H(token), timeout=10,
                       content=b'{"command": ["' + b"x" * (2 << 20) + b'"]}')
        assert r.status_code == 413 and "error" in r.json()
        r = httpx.post(url + "/api/v1/jobs", headers={**H(token), "content-type":
                       "application/json"}, content=b"\xff\xfe{", timeout=10)
        assert r.status_code == 422
        r = httpx.post(url + "/api/v1/jobs", headers=H(token), json={"command": ["true"]},
                       timeout=10)
        assert r.status_code == 201
        busy = ApiServer(srv.app, parse_listen(url.rsplit(":", 1)[1]))
        with pytest.raises(ListenError, match="cannot listen"):
            busy.start()
    finally:
        srv.stop()


@pytest.mark.skipif(__import__("shutil").which("openssl") is None, reason="needs openssl")
def test_server_speaks_https_with_a_certificate(tmp_path: Path) -> None:
    import ssl
    import subprocess

    import httpx

    from miso.api.server import ApiServer, parse_listen

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    users = UserStore(":memory:")
    token = users.add("gus")
    srv = ApiServer(create_app(StoreController(JobStore(":memory:")), users),
                    parse_listen("127.0.0.1:0", tls_cert=str(cert), tls_key=str(key)))
    url = srv.start()
    try:
        assert url.startswith("https://127.0.0.1:")
        r = httpx.get(url + "/api/v1/users/me", headers=H(token), timeout=10,
                      verify=ssl.create_default_context(cafile=str(cert)))
        assert r.json()["name"] == "gus"
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https", "http") + "/api/v1/users/me", timeout=5)
    finally:
        srv.stop()
