"""``miso status``'s summary never waits: it answers from the counts and cluster view read
with the last snapshot (off the event loop), not behind a page's refresh of the snapshot;
a user's own submissions are in its next summary; the audit record is written in groups."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from test_api import H, StoreController

from miso.api.app import create_app
from miso.api.users import UserStore
from miso.controller import JobStore


class GatedController(StoreController):
    """A controller whose cluster view can be held up (a slow snapshot refresh)."""

    def __init__(self, store: JobStore) -> None:
        super().__init__(store)
        self.hold = False
        self.gate = threading.Event()
        self.held = threading.Event()
        self.calls = 0

    def cluster(self) -> dict[str, Any]:
        self.calls += 1
        if self.hold:
            self.held.set()
            self.gate.wait(20)
        return super().cluster()


def test_the_summary_does_not_wait_behind_the_pages_refresh(tmp_path: Path) -> None:
    users = UserStore(tmp_path / "users.db")
    ctl = GatedController(JobStore(tmp_path / "miso.db"))
    admin = users.add("admin", admin=True)
    with TestClient(create_app(ctl, users, snapshot_ttl=0.05)) as client:
        client.post("/api/v1/jobs", json={"command": ["true"]}, headers=H(admin))
        first = client.get("/api/v1/status?summary=true", headers=H(admin)).json()
        assert first["counts"] == {"mine": {"queued": 1}, "all": {"queued": 1}}
        time.sleep(0.1)  # older than the ttl: the page refreshes it
        ctl.hold = True
        page: dict[str, Any] = {}
        t = threading.Thread(target=lambda: page.update(
            r=client.get("/api/v1/status?limit=5", headers=H(admin))))
        t.start()
        assert ctl.held.wait(10)  # the page's refresh is under way, and stuck
        r = client.get("/api/v1/status?summary=true", headers=H(admin))
        assert "r" not in page  # answered while the page still waits
        assert r.status_code == 200 and r.json()["counts"] == first["counts"]
        assert r.json()["gpus"] == 1 and r.json()["errors"] == ["boom"]
        ctl.hold = False
        ctl.gate.set()
        t.join(20)
        assert page["r"].status_code == 200 and len(page["r"].json()["jobs"]) == 1


def test_a_users_own_submission_is_in_its_next_summary(tmp_path: Path) -> None:
    users = UserStore(tmp_path / "users.db")
    ctl = GatedController(JobStore(tmp_path / "miso.db"))
    alice, bob = users.add("alice"), users.add("bob")
    with TestClient(create_app(ctl, users, snapshot_ttl=60.0)) as client:
        s = client.get("/api/v1/status?summary=true", headers=H(alice)).json()
        assert s["counts"] == {"mine": {}, "all": {}} and "errors" not in s
        calls = ctl.calls
        for _ in range(3):  # fresh: answered from the part, no new snapshot
            client.get("/api/v1/status?summary=true", headers=H(bob))
        assert ctl.calls == calls
        r = client.post("/api/v1/jobs", json={"command": ["true"]}, headers=H(alice))
        jid = r.json()["id"]
        s = client.get("/api/v1/status?summary=true", headers=H(alice)).json()
        assert s["counts"] == {"mine": {"queued": 1}, "all": {"queued": 1}}
        client.post(f"/api/v1/jobs/{jid}/cancel", headers=H(alice))
        s = client.get("/api/v1/status?summary=true", headers=H(alice)).json()
        assert s["counts"]["mine"] == {"cancelled": 1}


def test_an_old_summary_is_answered_and_read_anew_in_the_background(tmp_path: Path) -> None:
    users = UserStore(tmp_path / "users.db")
    ctl = GatedController(JobStore(tmp_path / "miso.db"))
    admin = users.add("admin", admin=True)
    with TestClient(create_app(ctl, users, snapshot_ttl=0.05)) as client:
        client.get("/api/v1/status?summary=true", headers=H(admin))
        calls = ctl.calls
        ctl.store.submit(command=["true"], name="x", memory_gb=1.0)  # not through the API
        time.sleep(0.1)  # older than the ttl, younger than the second it may be answered
        s = client.get("/api/v1/status?summary=true", headers=H(admin)).json()
        assert s["counts"]["all"] == {}  # the last part, answered at once
        for _ in range(200):  # meanwhile read anew in the pool
            if ctl.calls > calls:
                break
            time.sleep(0.02)
        assert ctl.calls == calls + 1
        for _ in range(200):
            s = client.get("/api/v1/status?summary=true", headers=H(admin)).json()
            if s["counts"]["all"]:
                break
            time.sleep(0.02)
        assert s["counts"]["all"] == {"queued": 1}


def test_audit_entries_recorded_together_are_all_kept(tmp_path: Path) -> None:
    users = UserStore(tmp_path / "users.db")
    go = threading.Barrier(8)

    def run(k: int) -> None:
        go.wait()
        for i in range(40):
            users.record(f"u{k}", "submit", f"j{k}-{i}", {"i": i})

    ts = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rows = users.audit(limit=1000)
    assert sorted(r["job"] for r in rows) == sorted(f"j{k}-{i}" for k in range(8)
                                                   for i in range(40))
    mine = [r for r in rows if r["user"] == "u3"]
    assert [r["detail"]["i"] for r in mine] == list(range(40))  # each caller's order kept


def test_token_lookups_do_not_wait_for_the_audit_writer(tmp_path: Path) -> None:
    """Authentication (on the API's event loop) reads on its own connection: an audit write
    stuck on the database does not hold it up; a token changed through the store stops
    working at once."""
    import sqlite3

    users = UserStore(tmp_path / "users.db", auth_ttl=0.0)
    tok = users.add("alice")
    other = sqlite3.connect(tmp_path / "users.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer: the audit insert waits for it
    t = threading.Thread(target=users.record, args=("alice", "submit", "j1"))
    t.start()
    time.sleep(0.2)  # the record call is waiting inside the store's write path
    assert t.is_alive()
    who = users.authenticate(tok)
    assert who is not None and who.name == "alice"
    assert t.is_alive()  # answered while the audit write still waits
    other.execute("COMMIT")
    t.join(10)
    assert [r["job"] for r in users.audit()] == ["j1"]
    new = users.rotate("alice")
    assert users.authenticate(tok) is None and users.authenticate(new) is not None
    other.close()
    users.close()
