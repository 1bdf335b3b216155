"""Each item the scheduling loop takes from its queue or its clock, handed to what handles its
kind: a driver step for an event or a timer, a progress report folded in, a stop
(:mod:`miso.controller.loopstops`), the owners' new weights and quotas. Any exception of one
item is logged and shown in the errors; the loop goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from miso.controller.loopprogress import job_progress, progress_reports
from miso.controller.loopstops import LoopStops
from miso.controller.runtime import Runtime
from miso.sched import ClusterState, Event, JobFailed, Tick
from miso.sched.driver import DriverStep

log = logging.getLogger(__name__)


class ItemDispatch:
    """The dispatch of one loop (see the module docstring); ``handle(ev)`` runs one driver
    step on the loop thread (the loop's, which makes a job's end terminal in the store
    first)."""

    def __init__(self, rt: Runtime, state: ClusterState, step: DriverStep, stops: LoopStops,
                 handle: Callable[[Event], None]) -> None:
        self.rt = rt
        self.state = state
        self.step = step
        self.stops = stops
        self.handle = handle

    def __call__(self, item: tuple[Any, ...], timed: bool = True) -> None:
        """Handle ``item`` now; ``timed``: report an event's wait and handling time (False
        in a group or a batch, whose times the loop reports for all its items)."""
        rt = self.rt
        kind = item[0]
        if kind == "event":
            t0 = time.monotonic()
            self.safe(self.handle, item[1])
            if timed and rt.observer is not None and len(item) > 2:
                rt.observer.on_timing("loop_lag", t0 - item[2])
                rt.observer.on_timing("event_handling", time.monotonic() - t0)
        elif kind == "tick":
            self.safe(self.handle, Tick(item[1]))
        elif kind == "progress":  # the item's shapes: loopprogress.progress_reports
            for job, report in progress_reports(item, rt.take_progress):
                self.safe(self.progress, job, *report)
        elif kind == "cancel":
            self.safe(self.stops.cancel, item[1])
            item[2].set()
        elif kind == "node_lost":
            self.safe(self.stops.node_lost, item[1])
        elif kind == "time_limit":  # its attempt stopped (LoopStops.time_out): it ends
            self.safe(self.handle, JobFailed(item[1], item[2]))
        elif kind == "time_requeue":  # stopped after a checkpoint: back in the queue
            self.safe(self.stops.time_requeue, *item[1:])
        elif kind == "make_room":  # a queued replica job of the head waits for a slice
            self.safe(self.stops.make_room, item[1])
        elif kind == "tenancy" and self.state.tenancy is not None:
            # new weights / quotas (``miso quota set``): the next decision orders by them
            self.state.tenancy.config = item[1]

    def safe(self, fn: Any, *args: Any) -> None:
        """``fn(*args)``; an exception is logged and shown in the errors, not raised."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - the loop must survive anything
            log.exception("controller: %s(%s) failed", getattr(fn, "__name__", fn), args)
            self.rt.error(f"{type(e).__name__}: {e}")

    def progress(self, job: str, gpu: str, placement: Any, mps_pct: int | None,
                 iterations_left: float, rate: float) -> None:
        """A job's own progress report, folded into the state as :class:`JobProgress`
        (nothing when it came too late: :func:`~miso.controller.loopprogress.job_progress`)."""
        ev = job_progress(self.state, job, gpu, placement, mps_pct, iterations_left, rate)
        if ev is not None:
            self.step(self.rt.now(), ev)
