"""Reading a state directory without a running cluster (``miso logs`` after ``down``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from miso.agent.logfile import attempt_lines


def _job_id(db: Path, job: str) -> str:
    """The id of job ``job`` (an id or a name), from the store opened read-only."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = con.execute("SELECT id FROM jobs WHERE id=? OR name=? ORDER BY (id=?) DESC, "
                              "seq DESC LIMIT 1", (job, job, job)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        row = None
    if row is None:
        raise LookupError(f"no job {job!r} in {db}")
    return str(row[0])


def logs_from_disk(state_dir: str | Path, job: str, tail: int = 200) -> str:
    """The last ``tail`` lines of every attempt log of ``job`` left under ``state_dir``."""
    d = Path(state_dir)
    jid = _job_id(d / "miso.db", job)
    out = []
    found = []
    for node_dir in sorted((d / "agents").glob("*")):
        for att in (node_dir / "jobs" / jid).glob("attempt-*"):
            n = att.name.split("-")[-1]
            if n.isdigit():
                found.append((int(n), node_dir.name, att / "output.log"))
    for n, node, f in sorted(found):
        try:
            lines = attempt_lines(f, tail)  # from the end: O(tail), not O(log)
        except OSError:
            continue
        out.append(f"--- {jid} attempt-{n} on {node} ---")
        out.extend(lines)
    if not out:
        raise LookupError(f"job {jid} left no logs under {d / 'agents'}")
    return "\n".join(out)
