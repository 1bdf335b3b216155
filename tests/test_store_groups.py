"""The store's submit and read paths under concurrency: submissions written in groups (one
transaction for those waiting on the store's lock), reads on a second connection that never
waits for a writer, and backups that do not stop the writers."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from miso.controller.store import JobStore, StoreConflict, StoreError


def _submit(s: JobStore, i: int, **kw: object) -> str:
    args: dict[str, object] = {"command": ["true", str(i)], "name": f"n{i}", "memory_gb": 1.0,
                               "owner": "u1", "request_id": f"u1:r{i}"}
    args.update(kw)
    return s.submit(**args).id  # type: ignore[arg-type]


def test_concurrent_submissions_are_grouped_and_each_gets_its_own_job(tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    ids: dict[int, str] = {}
    go = threading.Barrier(8)

    def run(k: int) -> None:
        go.wait()
        for i in range(k * 50, k * 50 + 50):
            ids[i] = _submit(s, i)

    with s.db.lock:  # the writers queue up behind the lock: the next holder writes a group
        ts = [threading.Thread(target=run, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        while s.table.writer.waiting() < 8:  # the queue formed
            threading.Event().wait(0.005)
    for t in ts:
        t.join()
    assert sorted(ids.values()) == [f"j{n:04d}" for n in range(1, 401)]
    for i, jid in ids.items():
        rec = s.get(jid)
        assert (rec.name, rec.command, rec.request_id) == (f"n{i}", ["true", str(i)],
                                                           f"u1:r{i}")
        assert rec.num_gpus is None and rec.after is None  # a one-GPU job's row as before
    assert s.db.meta("next_job") == "401"


def test_a_group_refuses_a_duplicate_name_and_returns_a_retry_without_failing_others(
        tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    first = _submit(s, 1)
    out: dict[str, object] = {}

    def run(tag: str, i: int, **kw: object) -> None:
        try:
            out[tag] = _submit(s, i, **kw)
        except StoreError as e:
            out[tag] = e

    ts = [threading.Thread(target=run, args=a, kwargs=k) for a, k in (
        (("retry", 1), {}),                                   # same request again: same job
        (("conflict", 1), {"memory_gb": 2.0}),                # same id, other request
        (("dup", 9), {"name": "n1", "request_id": "u1:r9"}),  # a name in use
        (("ok", 2), {}))]
    with s.db.lock:
        for t in ts:
            t.start()
        while s.table.writer.waiting() < 4:  # one group of four
            threading.Event().wait(0.005)
    for t in ts:
        t.join()
    assert out["retry"] == first
    assert isinstance(out["conflict"], StoreConflict)
    assert isinstance(out["dup"], StoreError) and "already active" in str(out["dup"])
    assert out["ok"] == "j0002" and s.get("n2").id == "j0002"
    assert s.counts() == {"queued": 2}


def test_reads_see_committed_jobs_and_do_not_wait_for_the_writers_lock(tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    jid = _submit(s, 1)
    got: dict[str, object] = {}

    def read() -> None:
        got["counts"] = s.reads.counts()
        got["job"] = s.reads.get(jid).name
        got["page"] = [r.id for r in s.reads.jobs(limit=5)]

    with s.db.lock:  # a writer holds the store: the read connection answers anyway
        t = threading.Thread(target=read)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive()
    assert got == {"counts": {"queued": 1}, "job": "n1", "page": [jid]}
    with pytest.raises(sqlite3.OperationalError):  # it is read-only
        s.reads.s.conn.execute("DELETE FROM jobs")  # type: ignore[union-attr]
    assert JobStore(":memory:").reads is not None


def test_a_backup_does_not_need_the_writers_lock(tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    jid = _submit(s, 1)
    with s.db.lock:
        t = threading.Thread(target=s.backup, args=(tmp_path / "copy.db",))
        t.start()
        t.join(timeout=10)
        assert not t.is_alive()
    assert JobStore(tmp_path / "copy.db").get(jid).name == "n1"


def test_a_submitted_jobs_record_is_the_row_as_read_back(tmp_path: Path) -> None:
    """The record a submission returns is built from the values written, not read back: it
    must equal what reading the row gives, for every kind of submission."""
    s = JobStore(tmp_path / "m.db")
    kinds: list[dict[str, object]] = [
        {"command": ["python", "-c", "1"], "name": None, "memory_gb": 2},
        {"command": ["true"], "name": "a", "memory_gb": 1.5, "memory_gib": 1.4,
         "workload": "resnet50", "env": {"A": "1"}, "cwd": "/tmp", "owner": "u1",
         "unix_user": "alice", "request_id": "u1:x", "owner_name": "alice",
         "host_memory_gb": 8, "num_gpus": 2, "nodes": 1, "profile": "3g.20gb",
         "after": ["j0001"]},
        {"command": ["true"], "name": "b", "memory_gb": 1.0, "at": 12.5, "num_gpus": 1},
    ]
    for kw in kinds:
        rec = s.submit(**kw)  # type: ignore[arg-type]
        assert rec == s.get(rec.id)
        assert rec == s.reads.get(rec.id)
    again = s.submit(**kinds[1])  # type: ignore[arg-type]  # a retry: the first job's record
    assert again == s.get("a")


def test_counts_by_owner_sum_to_the_counts(tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    for i in range(9):
        _submit(s, i, owner=f"u{i % 3}" if i % 4 else None, request_id=None)
    s.finish("j0002", "finished", at=1.0)
    by = s.reads.counts_by_owner()
    assert by[None] == {"queued": 3}
    assert by["u1"] == {"finished": 1, "queued": 1}
    total: dict[str, int] = {}
    for c in by.values():
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    assert total == s.counts()
    assert JobStore(":memory:").counts_by_owner() == {}


def test_brief_lists_every_job_as_its_row_in_submission_order(tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    for i in range(5):
        _submit(s, i, owner=None if i == 2 else "u1", owner_name=None if i == 2 else "al",
                at=10.25 + i)
    s.finish("j0004", "failed", reason="x", at=20.0)
    rows = [dict(r) for r in s.db.conn.execute(
        "SELECT id, state, owner, owner_name, submitted_at FROM jobs ORDER BY seq")]
    assert s.brief() == rows == s.reads.brief()
    assert rows[3]["state"] == "failed" and rows[2]["owner"] is None
    assert JobStore(":memory:").brief() == []


def test_owners_of_some_jobs(tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    for i in range(4):
        _submit(s, i, owner=None if i == 1 else f"u{i}")
    assert s.reads.owners({"j0001", "j0002", "j0004", "nope"}) == {
        "j0001": "u0", "j0002": None, "j0004": "u3"}
    assert s.owners([]) == {}
