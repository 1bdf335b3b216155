"""A status page's store reads do not grow with the cluster: a queued job's line looks at
every placed job (does it keep its slice because it cannot checkpoint, and whose is it?), read
once per page, not once per placed job per listed job (which made the merged tree's submissions
collapse to 6/s at 64 GPUs x 1,000 jobs: the page's reads held the store's lock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from test_api import H, StoreController

from miso.api.app import create_app
from miso.api.users import UserStore
from miso.controller import JobStore


class PlacedController(StoreController):
    """The first ``placed`` active jobs resident on GPUs of three jobs each; the rest queued
    and unplaced."""

    def __init__(self, store: JobStore, placed: int) -> None:
        super().__init__(store)
        self.placed = placed

    def cluster(self) -> dict[str, Any]:
        active = [r.id for r in self.store.jobs(active_only=True)]
        on = active[: self.placed]
        gpus = [{"id": f"n{i // 24}/{i // 3 % 8}", "model": "A100-40GB", "phase": "steady",
                 "layout": ["7g.40gb@0"], "jobs": on[i:i + 3], "assignment": {},
                 "mps_shares": {}} for i in range(0, len(on), 3)]
        return {"gpus": gpus, "queue": active[self.placed:], "nodes": ["n0"], "time": 1.0,
                "policy": "miso", "errors": []}


def page(tmp_path: Path, placed: int) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """SQL statements of one admin status page over ``placed`` placed jobs (and 10 queued),
    and the admin's and alice's pages."""
    users = UserStore(tmp_path / f"users{placed}.db")
    store = JobStore(tmp_path / f"miso{placed}.db")
    ctl = PlacedController(store, placed)
    tok = {"admin": users.add("admin", admin=True), "alice": users.add("alice"),
           "bob": users.add("bob")}
    with TestClient(create_app(ctl, users, snapshot_ttl=0.0)) as client:
        for i in range(placed + 10):
            who = "bob" if i < placed else "alice"
            client.post("/api/v1/jobs", json={"command": ["true"], "name": f"x{i}"},
                        headers=H(tok[who]))
        ids = [r.id for r in store.jobs()]
        for j in ids[:2]:  # two of bob's placed jobs cannot checkpoint
            store.update(j, checkpointable=False)
        statements: list[str] = []
        store.db.conn.set_trace_callback(statements.append)
        admin = client.get("/api/v1/status?limit=10", headers=H(tok["admin"])).json()
        store.db.conn.set_trace_callback(None)
        alice = client.get("/api/v1/status?limit=10", headers=H(tok["alice"])).json()
    return len(statements), admin, alice


def test_a_status_pages_reads_do_not_grow_with_the_placed_jobs(tmp_path: Path) -> None:
    small, admin, alice = page(tmp_path, 6)
    big, admin_big, _ = page(tmp_path, 300)
    assert big == small  # not one read per placed job
    line = admin["jobs"][-1]["why"]
    assert "bob's 2 jobs cannot be moved (they do not checkpoint)" in line, line
    assert "bob's 2 jobs cannot be moved" in admin_big["jobs"][-1]["why"]
    # alice (not an admin) learns only that another user's jobs are pinned, never whose
    mine = alice["jobs"][-1]["why"]
    assert "another user's jobs cannot be moved" in mine and "bob" not in mine, mine


def test_a_page_of_waiting_lines_looks_at_each_placed_job_once() -> None:
    from collections import Counter

    from miso.controller.statustext import SnapIndex, why

    gpus = [{"id": f"n{i // 8}/{i % 8}", "phase": "steady" if i % 5 else "mig",
             "jobs": [f"x{i}_{k}" for k in range(3)]} for i in range(40)]
    snap = {"gpus": gpus}
    looked: Counter[str] = Counter()

    def cannot_checkpoint(x: str) -> bool:
        looked[x] += 1
        return x.endswith("_0") and x in ("x3_0", "x7_0")

    owners = {"x3_0": "bob", "x7_0": "carol"}
    ix = SnapIndex(snap, cannot_checkpoint)
    jobs = [{"id": f"q{n}", "state": "queued", "memory_gib": 5.0, "owner_name": "alice"}
            for n in range(30)] + [{"id": "x3_1", "state": "queued", "owner_name": "alice"}]
    lines = [why(j, snap, cannot_checkpoint, admin=True, owner_of=owners.get, index=ix)
             for j in jobs[:-1]]
    assert max(looked.values()) == 1 and len(looked) == 120  # once per placed job, not per line
    lines.append(why(jobs[-1], snap, cannot_checkpoint, admin=True, owner_of=owners.get,
                     index=ix))  # placed: its own GPU's other jobs
    assert lines[0].endswith("(40 GPUs: 8 mig, 32 steady, 120 jobs placed): bob's 1 job cannot "
                             "be moved; carol's 1 job cannot be moved (they do not checkpoint)")
    assert lines[-1] == ("waiting on n0/3: a job there cannot checkpoint and keeps its slice "
                         "until it ends; no layout adds this job beside it")
    # the same lines without a shared index
    assert lines == [why(j, snap, cannot_checkpoint, admin=True, owner_of=owners.get)
                     for j in jobs]
