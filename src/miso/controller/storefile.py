"""The job store's files in a state directory: opening it, spotting damage, its backup.

``store.json`` marks a state directory that held a store: a missing, empty or unreadable
``miso.db`` there is refused with one line saying how to recover (``miso.db.bak`` is a copy
taken at every open). Job ids are never reused: a new id also skips every id that has a
checkpoint or agent directory.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from pathlib import Path

from miso.controller.schema import StoreError
from miso.controller.store import JobStore

log = logging.getLogger(__name__)

MARKER = "store.json"
BACKUP = "miso.db.bak"
_JOB_DIR = re.compile(r"^j\d{4,}$")


def used_job_ids(state_dir: str | Path) -> set[str]:
    """Ids with a directory under ``checkpoints/`` or ``agents/*/jobs/`` of ``state_dir``."""
    d = Path(state_dir)
    dirs = list((d / "checkpoints").glob("j*")) + list((d / "agents").glob("*/jobs/j*"))
    return {p.name for p in dirs if _JOB_DIR.match(p.name)}


def _recovery_hint(d: Path) -> str:
    db, bak = d / "miso.db", d / BACKUP
    return (f"restore it from its backup (copied at each start and after new jobs: cp {bak} "
            f"{db}) or move "
            f"{d} away to start afresh" if bak.exists() else f"move {d} away to start afresh")


def store_problem(state_dir: str | Path) -> str | None:
    """What is wrong with the job store of ``state_dir`` and how to recover (one line), or
    None when it is fine or new. Reads only."""
    d = Path(state_dir)
    db = d / "miso.db"
    if not (d / MARKER).exists():
        return None
    if not db.exists():
        return f"the job store {db} is missing (it held jobs before); {_recovery_hint(d)}"
    if db.stat().st_size == 0:
        return f"the job store {db} is empty (truncated?); {_recovery_hint(d)}"
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            con.execute("SELECT count(*) FROM jobs").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        return f"{db}: not a readable job store ({e}); {_recovery_hint(d)}"
    return None


def open_store(state_dir: str | Path) -> JobStore:
    """The job store of ``state_dir`` (``miso.db``), created on first use.

    Refuses, with one line saying what is wrong and how to recover, a store that is missing,
    empty or unreadable where one existed (``store.json``); backs the store up to
    ``miso.db.bak`` on every successful open.
    """
    d = Path(state_dir)
    db, marker, bak = d / "miso.db", d / MARKER, d / BACKUP
    fix = _recovery_hint(d)
    existed = marker.exists()
    problem = store_problem(d)
    if problem:
        raise StoreError(problem)
    if not existed and db.exists() and db.stat().st_size == 0:
        db.unlink()
    used = used_job_ids(d)
    first = 1 + max((int(x[1:]) for x in used), default=0)
    try:
        store = JobStore(db, first_id=first)
        store.job_ids()
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{db}: not a readable job store ({e}); {fix}") from None
    except StoreError as e:
        raise StoreError(f"{e}; {fix}") from None
    if not existed:
        marker.write_text(json.dumps({"created": time.time(), "epoch": store.epoch}))
    try:
        store.backup(bak)
    except (OSError, sqlite3.Error) as e:
        log.warning("job store backup to %s failed: %s", bak, e)
    return store
