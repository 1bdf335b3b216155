"""Private, consistent copies of a SQLite database in use (the job store's, the users')."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def backup_private(conn: sqlite3.Connection, dest: str | Path) -> None:
    """Copy the database behind ``conn`` to ``dest`` while it is in use; the copy is private
    (mode 0600) like the stores themselves. Copies of one database share a temporary file:
    the caller holds its store's lock."""
    tmp = Path(f"{dest}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.touch(mode=0o600)
    out = sqlite3.connect(tmp)
    try:
        conn.backup(out)
    finally:
        out.close()
    tmp.replace(dest)
