"""The job store's history of the cluster: the layouts applied to GPUs, and events
(profiling results, failed layouts, decisions) as JSON.

A part of :class:`~miso.controller.store.JobStore` (over its one connection,
:class:`~miso.controller.storedb.StoreDb`).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

from miso.controller.storedb import StoreDb


class EventLog:
    """The ``layouts`` and ``events`` tables."""

    def __init__(self, s: StoreDb) -> None:
        self.s = s

    def record_layout(self, gpu: str, model: str, layout: list[list[Any]], *,
                      plan_id: int | None, ok: bool, at: float) -> None:
        with self.s.lock:
            self.s.conn.execute("INSERT INTO layouts(at, gpu, model, plan_id, layout, ok) "
                             "VALUES(?,?,?,?,?,?)",
                             (at, gpu, model, plan_id, json.dumps(layout), int(ok)))

    def layouts(self) -> list[dict[str, Any]]:
        with self.s.lock:
            rows = [dict(r) for r in self.s.conn.execute("SELECT * FROM layouts ORDER BY seq")]
        for r in rows:
            r["layout"] = json.loads(r["layout"])
        return rows

    def log_event(self, at: float, kind: str, body: dict[str, Any]) -> None:
        with self.s.lock:
            self.s.conn.execute("INSERT INTO events(at, kind, body) VALUES(?,?,?)",
                             (at, kind, json.dumps(body, default=str)))

    def log_events(self, rows: list[tuple[float, str, dict[str, Any]]]) -> None:
        """:meth:`log_event` of several ``(at, kind, body)`` in one transaction."""
        if not rows:
            return
        data = [(at, kind, json.dumps(body, default=str)) for at, kind, body in rows]
        with self.s.lock:
            self.s.conn.execute("BEGIN")
            try:
                self.s.conn.executemany("INSERT INTO events(at, kind, body) VALUES(?,?,?)",
                                        data)
                self.s.conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.s.conn.execute("ROLLBACK")
                raise

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM events", ()
        if kind:
            q, args = q + " WHERE kind=?", (kind,)
        with self.s.lock:
            rows = [dict(r) for r in self.s.conn.execute(q + " ORDER BY seq", args)]
        for r in rows:
            r["body"] = json.loads(r["body"])
        return rows
