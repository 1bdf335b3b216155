"""The job store: one vocabulary of job states, its parts over one connection, old files."""

from __future__ import annotations

import inspect
import sqlite3
from pathlib import Path

import pytest

from miso.controller.schema import SCHEMA, STATES, TERMINAL, V2_COLUMNS
from miso.controller.store import JobStore, StoreError
from miso.jobstatus import JobStatus
from miso.sched import ClusterState, JobSpec, JobSubmitted


def test_store_states_are_job_statuses_and_persist_as_plain_strings(tmp_path: Path) -> None:
    assert set(STATES) | {JobStatus.PLACED} == set(JobStatus)
    assert set(TERMINAL) < set(STATES)
    s = JobStore(tmp_path / "m.db")
    j = s.submit(command=["true"], name="a", memory_gb=1.0).id
    s.update(j, state=JobStatus.CHECKPOINTING)
    s.close()
    raw = sqlite3.connect(tmp_path / "m.db").execute(
        "SELECT state, typeof(state) FROM jobs WHERE id=?", (j,)).fetchone()
    assert raw == ("checkpointing", "text")
    s = JobStore(tmp_path / "m.db")
    assert s.get(j).state == JobStatus.CHECKPOINTING and type(s.get(j).to_json()["state"]) is str
    with pytest.raises(StoreError, match="unknown state"):
        s.update(j, state=JobStatus.PLACED)  # the core's word; the store says queued
    assert s.finish(j, JobStatus.CANCELLED, at=1.0) and s.get(j).terminal


def test_the_core_uses_the_same_vocabulary() -> None:
    st = ClusterState()
    st.observe(0.0, JobSubmitted(JobSpec("j1", "j1", 4.0, "resnet_train64")))
    assert st.jobs["j1"].status is JobStatus.QUEUED and st.jobs["j1"].status in STATES


def test_facade_keeps_every_method_and_its_parts_share_one_connection(tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    for name in ("submit", "get", "jobs", "counts", "owners", "owner_rows", "set_owner",
                 "job_ids", "update", "progress", "finish", "new_attempt", "end_attempt",
                 "attempts", "open_attempts", "record_layout", "layouts", "log_event", "events",
                 "backup", "close"):
        assert inspect.getdoc(getattr(s, name)) == inspect.getdoc(
            getattr(next(p for p in (s.table, s.attempt_log, s.event_log, s.db)
                         if hasattr(p, name)), name)), name
    j = s.submit(command=["true"], name=None, memory_gb=2.0).id
    n = s.new_attempt(j, node="n0", gpu="n0/0", placement="0:7g.40gb", mps_pct=None,
                      resume_iteration=None, at=1.0, restart=False)
    s.log_event(2.0, "profile", {"gpu": "n0/0"})
    assert s.table.get(j).attempts == n == 1
    assert [a["job"] for a in s.attempt_log.open_attempts()] == [j]
    assert s.event_log.events("profile")[0]["body"] == {"gpu": "n0/0"}
    assert s.table.s is s.attempt_log.s is s.event_log.s is s.db
    s.lease_horizon = 5.0
    assert JobStore(tmp_path / "m.db").lease_horizon == 5.0


def test_a_version_1_store_file_opens_migrated_with_its_jobs(tmp_path: Path) -> None:
    v1 = SCHEMA
    for col, _ in V2_COLUMNS:
        v1 = "\n".join(line for line in v1.splitlines() if not line.strip().startswith(col))
    v1 = v1.replace("owner_name TEXT,", "owner_name TEXT")
    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript(v1)
    db.executemany("INSERT INTO meta VALUES(?, ?)",
                   [("schema_version", "1"), ("epoch", "1000.0"), ("next_job", "2")])
    db.execute("INSERT INTO jobs(id, name, command, memory_gb, state, submitted_at) "
               "VALUES('j0001', 'old', '[\"true\"]', 2.0, 'running', 5.0)")
    db.commit()
    db.close()
    s = JobStore(tmp_path / "old.db")
    assert s.schema_version == 2 and s.epoch == 1000.0
    old = s.get("old")
    assert old.state == JobStatus.RUNNING and old.note == "" and old.memory_gib > 1.8
    assert s.submit(command=["true"], name=None, memory_gb=1.0).id == "j0002"
