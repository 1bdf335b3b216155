"""What the job store holds: its SQL schema and version, the job states (from
:mod:`miso.jobstatus`), a job's record.

Plain definitions (no I/O); :mod:`miso.controller.store` reads and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from miso import jobstatus
from miso.jobstatus import JobStatus

SCHEMA_VERSION = 2
GIB_PER_GB = 1e9 / 2**30
#: The states a job of the store can be in (plain strings, as persisted: the values of
#: :class:`~miso.jobstatus.JobStatus`, the one vocabulary).
STATES = tuple(s.value for s in jobstatus.STORE)
TERMINAL = tuple(s.value for s in jobstatus.TERMINAL)

#: Owners' weights and quotas, and jobs' priorities (:mod:`miso.controller.quotas`), and
#: owners' decayed usage (:mod:`miso.controller.usagestore`): tables
#: added beside the jobs (no column of ``jobs`` changes, so no schema version bump; a store
#: without them gets them when opened).
TENANCY_SCHEMA = """
CREATE TABLE IF NOT EXISTS quotas (
  owner TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  weight REAL,
  max_in_use REAL,
  max_queued INTEGER,
  priority_limit INTEGER,
  updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS accounts (
  name TEXT PRIMARY KEY,
  weight REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS account_members (
  owner TEXT PRIMARY KEY,
  account TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_priority (
  job TEXT PRIMARY KEY,
  priority INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS owner_usage (
  owner TEXT PRIMARY KEY,
  usage REAL NOT NULL,
  total REAL NOT NULL,
  rate REAL NOT NULL,
  as_of REAL NOT NULL,
  half_life_s REAL NOT NULL
);
"""

SCHEMA = TENANCY_SCHEMA + """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT UNIQUE NOT NULL,
  name TEXT NOT NULL,
  command TEXT NOT NULL,
  memory_gb REAL NOT NULL,
  workload TEXT,
  env TEXT NOT NULL DEFAULT '{}',
  cwd TEXT,
  state TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  submitted_at REAL NOT NULL,
  started_at REAL,
  ended_at REAL,
  gpu TEXT,
  placement TEXT,
  mps_pct INTEGER,
  attempts INTEGER NOT NULL DEFAULT 0,
  restarts INTEGER NOT NULL DEFAULT 0,
  iteration INTEGER,
  total INTEGER,
  rate REAL,
  checkpoint_iteration INTEGER,
  checkpoint_path TEXT,
  owner TEXT,
  unix_user TEXT,
  owner_name TEXT,
  request_id TEXT UNIQUE,
  memory_gib REAL,
  host_memory_gb REAL,
  checkpointable INTEGER,
  note TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS attempts (
  job TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  node TEXT NOT NULL,
  gpu TEXT NOT NULL,
  placement TEXT NOT NULL,
  mps_pct INTEGER,
  resume_iteration INTEGER,
  start_iteration INTEGER,
  started_at REAL NOT NULL,
  ended_at REAL,
  status TEXT NOT NULL DEFAULT 'running',
  end_iteration INTEGER,
  checkpoint_iteration INTEGER,
  log TEXT,
  PRIMARY KEY (job, attempt)
);
CREATE TABLE IF NOT EXISTS layouts (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  at REAL NOT NULL,
  gpu TEXT NOT NULL,
  model TEXT NOT NULL,
  plan_id INTEGER,
  layout TEXT NOT NULL,
  ok INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  at REAL NOT NULL,
  kind TEXT NOT NULL,
  body TEXT NOT NULL
);
"""

#: Columns added by schema version 2 (added in place to a version-1 store).
V2_COLUMNS = (("request_id", "TEXT"), ("memory_gib", "REAL"), ("checkpointable", "INTEGER"),
               ("note", "TEXT NOT NULL DEFAULT ''"), ("host_memory_gb", "REAL"))
#: Columns of jobs on several GPUs (gangs), added in place (nullable: NULL is one GPU, any node).
GANG_COLUMNS = (("num_gpus", "INTEGER"), ("nodes", "INTEGER"))
#: A job pinned to one MIG profile (``--profile``) and the jobs it waits for (``--after``, a
#: JSON list), added in place (nullable: NULL is any profile, no dependency).
REQUEST_COLUMNS = (("mig_profile", "TEXT"), ("after_jobs", "TEXT"))

#: A job that ended in one of these states gives its name back (a re-run after a fix).
NAME_FREED = (JobStatus.FAILED.value, JobStatus.CANCELLED.value, JobStatus.OVER_LIMIT.value)


class StoreError(ValueError):
    """Bad request to the store (unknown job, duplicate name, schema mismatch, damage)."""


class StoreConflict(StoreError):
    """The request clashes with what the store holds (a request id used for another job)."""


@dataclass
class JobRecord:
    """One row of ``jobs`` as plain data."""

    id: str
    name: str
    command: list[str]
    memory_gb: float
    workload: str | None
    env: dict[str, str]
    cwd: str | None
    state: str
    reason: str
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    gpu: str | None
    placement: str | None
    mps_pct: int | None
    attempts: int
    restarts: int
    iteration: int | None
    total: int | None
    rate: float | None
    checkpoint_iteration: int | None
    checkpoint_path: str | None
    owner: str | None = None
    unix_user: str | None = None
    #: The owner's user name when the job was submitted (for display; ``owner`` is the id).
    owner_name: str | None = None
    request_id: str | None = None
    memory_gib: float | None = None
    checkpointable: bool | None = None
    note: str = ""
    #: the job's own host-memory bound, GB (None: its node's default; issue 26)
    host_memory_gb: float | None = None
    #: whole GPUs the job runs on at once (a gang when > 1; None: one GPU)
    num_gpus: int | None = None
    #: nodes a gang is spread over, equal counts each (None: as few as fit)
    nodes: int | None = None
    #: the MIG profile the job is pinned to (None: the policy chooses)
    profile: str | None = None
    #: jobs (ids) that must end before it may start (None: none)
    after: list[str] | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
