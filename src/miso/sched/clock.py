"""The clock a driver runs on: virtual for the simulator and tests, wall for live runs.

Both drivers read time only through a :class:`Clock` and keep their timers (policy
``WakeUp``\\ s, the simulator's physics, the live loop's deferred items) in its one heap, so
neither knows which clock drives it (SimPy's ``Environment`` / ``RealtimeEnvironment`` split).

* :class:`VirtualClock`: time moves only when the driver takes the next due item
  (:meth:`~VirtualClock.pop`) or a test calls :meth:`~VirtualClock.advance`; ties are broken
  by insertion order (a sequence number), so a run is deterministic.
* :class:`WallClock`: seconds since ``epoch`` (the store's creation for the live controller,
  so the clock survives a controller restart); items fall due as real time passes.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Time and timers of one driver (seconds)."""

    def now(self) -> float:
        """Current time."""
        ...

    def at(self, t: float, item: Any) -> None:
        """Schedule ``item`` to fall due at time ``t`` (ties: insertion order)."""
        ...

    def next_at(self) -> float | None:
        """When the earliest scheduled item falls due (None: nothing scheduled)."""
        ...

    def due(self) -> list[tuple[float, Any]]:
        """Remove and return the items due by :meth:`now`, earliest first."""
        ...

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass (a virtual clock jumps, a wall clock sleeps)."""
        ...


class _Timers:
    """The heap both clocks share: (time, sequence, item)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = 0
        self._lock = threading.Lock()

    def at(self, t: float, item: Any) -> None:
        with self._lock:
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, item))

    def next_at(self) -> float | None:
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def _due(self, now: float) -> list[tuple[float, Any]]:
        out = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                t, _, item = heapq.heappop(self._heap)
                out.append((t, item))
        return out

    def __len__(self) -> int:
        return len(self._heap)


class VirtualClock(_Timers):
    """Simulated time: it moves only when told to (see the module docstring).

    The simulator uses :meth:`pop` (take the next item and jump to its time) and
    :meth:`reserve`/:meth:`at_seq` (its arrivals enter the heap lazily, each with the sequence
    number it would have had if pushed at start); tests use :meth:`advance`.
    """

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._now = start

    def now(self) -> float:
        return self._now

    def due(self) -> list[tuple[float, Any]]:
        return self._due(self._now)

    def wait(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (items falling due are left for :meth:`due`)."""
        self.advance_to(self._now + seconds)

    def advance_to(self, t: float) -> None:
        """Move time forward to ``t`` (never backwards)."""
        if t > self._now:
            self._now = t

    def pop(self) -> tuple[float, Any] | None:
        """Take the earliest item and move time to it; None when nothing is scheduled."""
        heap = self._heap
        if not heap:
            return None
        t, _, item = heapq.heappop(heap)
        if t > self._now:
            self._now = t
        return t, item

    def peek(self) -> tuple[float, Any] | None:
        """The earliest item and its time, left scheduled; None when nothing is."""
        return (self._heap[0][0], self._heap[0][2]) if self._heap else None

    def reserve(self, n: int) -> int:
        """Reserve ``n`` sequence numbers; returns the one before the first."""
        base = self._seq
        self._seq += n
        return base

    def at_seq(self, t: float, seq: int, item: Any) -> None:
        """Schedule ``item`` with a sequence number from :meth:`reserve`."""
        heapq.heappush(self._heap, (t, seq, item))

    def __bool__(self) -> bool:
        return bool(self._heap)


class WallClock(_Timers):
    """Real time, in seconds since ``epoch`` (a Unix time)."""

    def __init__(self, epoch: float = 0.0) -> None:
        super().__init__()
        self.epoch = epoch

    def now(self) -> float:
        return time.time() - self.epoch

    def due(self) -> list[tuple[float, Any]]:
        return self._due(self.now())

    def wait(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def __bool__(self) -> bool:
        return True
