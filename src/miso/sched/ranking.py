"""Lazy ranking: the best few of many items whose keys only get worse until the item changes.

A policy that asks "which GPU has the job that gains most from moving?" would evaluate every GPU
per event. When an item's key (smaller is better) can only grow while the item is unchanged (a
job's remaining work only shrinks as it runs), a key computed earlier is a lower bound on the
key now, so a heap of old keys finds the best item by re-evaluating only the items that reach
its top (lazy evaluation). The owner calls :meth:`LazyRanking.changed` for every item whose key
may have improved (its GPU changed), then, once per decision round, :meth:`LazyRanking.refresh`
with a new evaluation stamp (keys evaluated under one stamp are exact) and :meth:`LazyRanking.pop`
as often as it needs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class LazyRanking(Generic[T]):
    """Items by key, smallest first; ``evaluate(item)`` gives its key now or None (not ranked
    until it changes). Keys must be distinct, mutually comparable, and never decrease while an
    item is unchanged."""

    def __init__(self, evaluate: Callable[[T], Any | None]) -> None:
        self.evaluate = evaluate
        self._heap: list[tuple[Any, int, T, int, int]] = []  # key, seq, item, version, stamp
        self._version: dict[T, int] = {}
        self._dirty: set[T] = set()
        self._seq = 0

    def changed(self, item: T) -> None:
        """``item`` changed (or appeared, or is gone): re-evaluate it before the next pop."""
        self._dirty.add(item)

    def __len__(self) -> int:
        return len(self._heap)

    def _push(self, item: T, stamp: int) -> None:
        key = self.evaluate(item)
        if key is not None:
            self._seq += 1
            heapq.heappush(self._heap, (key, self._seq, item, self._version[item], stamp))

    def refresh(self, stamp: int) -> None:
        """Evaluate the changed items (before popping; changes noted later wait for the next
        refresh)."""
        for item in self._dirty:
            self._version[item] = self._version.get(item, 0) + 1
            self._push(item, stamp)
        self._dirty.clear()
        if len(self._heap) > 4 * len(self._version) + 64:  # drop superseded entries
            self._heap = [e for e in self._heap if e[3] == self._version[e[2]]]
            heapq.heapify(self._heap)

    def peek(self, stamp: int) -> tuple[Any, T] | None:
        """(key, item) of the best item at ``stamp`` (the stamp of the last :meth:`refresh`),
        left in the ranking; None when nothing is ranked."""
        heap = self._heap
        while heap:
            key, _, item, ver, at = heap[0]
            if ver == self._version[item] and at == stamp:
                return key, item
            heapq.heappop(heap)
            if ver == self._version[item]:
                self._push(item, stamp)       # a lower bound: evaluate it now
        return None

    def take(self, item: T) -> None:
        """Take ``item`` out of the ranking until :meth:`changed` and :meth:`refresh` bring it
        back."""
        if item in self._version:
            self._version[item] += 1

    def pop(self, stamp: int) -> tuple[Any, T] | None:
        """Remove and return :meth:`peek`'s (key, item)."""
        got = self.peek(stamp)
        if got is not None:
            self.take(got[1])
        return got
