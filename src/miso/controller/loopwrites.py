"""What the scheduling loop writes to the store: a turn's placements in one transaction, and
the events and decisions it logs, kept and written in batches (:class:`EventLogBuffer`, each
one's body :func:`log_body`).

Each :class:`~miso.sched.decisions.PlaceJob` sets its job's GPU in the store. One UPDATE per
placement was one transaction each, and in a controller whose threads share one interpreter
every statement gives the interpreter lock away and waits to get it back: at 1,024 GPUs a
placement pass of a few hundred jobs spent ~20 % of the loop's time there. They are kept here
and written in one transaction (:meth:`PlacedBuffer.flush`) before anything else can write
those jobs' rows: before a decision is handed to the plan executor (its workers write the
rows of the jobs they launch or requeue), before the loop reads or writes a job itself, and
at the end of every turn. The plans decided with them (``StartProfiling``, ``ApplyLayout``,
``RunMps``) are held too and handed to the executor, in order, right after that write
(:meth:`PlacedBuffer.hold`): a placement pass over many GPUs alternates placements and plans,
and handing each plan over at once cost one transaction per GPU. So the store's rows change
in the same order as before, a turn later at most, and a reader of the store sees a
placement at most one turn late.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from miso.sched import Event, JobProgress

log = logging.getLogger(__name__)

#: Events and decisions kept before they are written to the store in one transaction (they
#: are written sooner when the loop's queue is empty or every ``SNAPSHOT_EVERY_S``).
LOG_BATCH = 500

#: Field value types :func:`dataclasses.asdict` returns as they are (its deep copy of an
#: immutable scalar is the scalar itself).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def log_body(x: Any) -> dict[str, Any]:
    """``dataclasses.asdict(x)`` (``{"repr": ...}`` for what is not a dataclass instance), of
    an event or decision for the store's event log. Most of them hold only scalars: their
    fields are read directly, without ``asdict``'s recursive deep copy (several percent of
    the loop's time at 1,024 GPUs); the others go through ``asdict`` (same result)."""
    if not dataclasses.is_dataclass(x) or isinstance(x, type):
        return {"repr": repr(x)}
    out = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    if all(type(v) in _SCALARS for v in out.values()):
        return out
    return dataclasses.asdict(x)


class PlacedBuffer:
    """Placements (job -> GPU) not yet written, and the plans decided after them not yet
    handed to the executor: ``store.place_many`` writes the placements, then ``submit``
    hands the plans over in the order decided (:meth:`flush`)."""

    def __init__(self, store: Any, on_error: Callable[[str], None],
                 submit: Callable[[str, Any], Any] | None = None) -> None:
        self.store = store
        self.on_error = on_error
        self.submit = submit
        self.placed: dict[str, str] = {}
        #: (GPU, plan) kept until the placements before them are written
        self.plans: list[tuple[str, Any]] = []

    def add(self, job: str, gpu: str) -> None:
        self.placed.pop(job, None)  # a later placement of the same job is written last
        self.placed[job] = gpu

    def hold(self, gpu: str, plan: Any) -> None:
        """Hand ``plan`` to the executor at the next :meth:`flush`, after the placements
        decided before it are written (its worker launches the jobs placed there)."""
        if self.submit is None:
            raise RuntimeError("PlacedBuffer.hold needs a submit function")
        self.plans.append((gpu, plan))

    def flush(self, also: Callable[[], None] | None = None) -> None:
        """Write the kept placements in one transaction (nothing kept: no statement), and
        run ``also`` (the loop's event log write) under the same hold of the store's lock
        (``store.writing``: the loop waits for it once); then hand the kept plans to the
        executor in order (outside the store's lock: the executor takes the runtime's lock,
        which other threads hold while they wait for the store's)."""
        if self.placed or also is not None:
            writing = getattr(self.store, "writing", None)
            with writing() if writing is not None else contextlib.nullcontext():
                self._write_placed()
                if also is not None:
                    also()
        if self.plans and self.submit is not None:
            plans, self.plans = self.plans, []
            for gpu, plan in plans:
                self.submit(gpu, plan)

    def _write_placed(self) -> None:
        if not self.placed:
            return
        rows, self.placed = self.placed, {}
        try:
            self.store.place_many(rows)
        except Exception as e:  # noqa: BLE001 - the loop must survive a full disk
            log.exception("controller: writing %d placements to the store failed", len(rows))
            self.on_error(f"placements: {type(e).__name__}: {e}")


class EventLogBuffer:
    """Events and decisions kept for the store's event log (``store.log_events``), written
    in one transaction by :meth:`flush`, or as soon as :data:`LOG_BATCH` wait."""

    def __init__(self, store: Any, on_error: Callable[[str], None]) -> None:
        self.store = store
        self.on_error = on_error
        #: events and decisions not yet written: (time, name, body)
        self.rows: list[tuple[float, str, dict[str, Any]]] = []

    def record(self, now: float, item: object) -> None:
        """Keep an event or decision (the driver step's ``record``); progress is not kept:
        it is in the job's record already."""
        if isinstance(item, JobProgress):
            return
        name = type(item).__name__
        self.rows.append((now, name if isinstance(item, Event) else "decision:" + name,
                          log_body(item)))
        if len(self.rows) >= LOG_BATCH:
            self.flush()

    def flush(self) -> None:
        """Write the events and decisions kept since the last time, in one transaction."""
        rows, self.rows = self.rows, []
        try:
            self.store.log_events(rows)
        except Exception as e:  # noqa: BLE001 - the loop must survive a full disk
            log.exception("controller: writing %d events to the store failed", len(rows))
            self.on_error(f"event log: {type(e).__name__}: {e}")
