"""One replica's request queue, request by request: dynamic batching and queueing.

The server takes every waiting request (up to ``max_batch``) the moment it is free; with
``max_delay_s`` > 0 a batch smaller than ``max_batch`` waits up to that long after its first
request for more (Triton's ``max_queue_delay``). A request's latency is its finish minus its
arrival. A request still waiting ``drop_after_s`` after it arrived is dropped (counted, no
latency). Pure: arrays in, arrays out.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ReplicaRun:
    """What one replica did with the requests it was given."""

    latency_s: np.ndarray  # per request, NaN where dropped
    finish_s: np.ndarray  # per request, NaN where dropped
    batches: int

    @property
    def dropped(self) -> int:
        return int(np.isnan(self.latency_s).sum())


def simulate_replica(
    arrivals_s: np.ndarray,
    batch_time_s: Callable[[int], float],
    max_batch: int,
    *,
    ready_s: float = 0.0,
    max_delay_s: float = 0.0,
    drop_after_s: float = float("inf"),
) -> ReplicaRun:
    """Serve ``arrivals_s`` (sorted, seconds) on one replica that is ready at ``ready_s``.

    ``batch_time_s(b)`` is the service time of a batch of ``b`` requests.
    """
    arr = np.asarray(arrivals_s, dtype=float)
    n = len(arr)
    lat = np.full(n, np.nan)
    fin = np.full(n, np.nan)
    if n == 0 or max_batch < 1:
        return ReplicaRun(lat, fin, 0)
    times = [batch_time_s(b) for b in range(max_batch + 1)]
    at = arr.tolist()
    ends: list[float] = []
    sizes: list[int] = []
    firsts: list[int] = []
    free = ready_s
    i = 0
    while i < n:
        start = free if free > at[i] else at[i]
        # drop what waited too long before this batch could start
        while start - at[i] > drop_after_s:
            i += 1
            if i >= n:
                break
            start = free if free > at[i] else at[i]
        if i >= n:
            break
        if max_delay_s > 0.0:
            k = i + max_batch - 1
            full_at = at[k] if k < n else float("inf")
            start = max(start, min(at[i] + max_delay_s, full_at))
        j = bisect_right(at, start, i + 1, min(n, i + max_batch))
        end = start + times[j - i]
        firsts.append(i)
        sizes.append(j - i)
        ends.append(end)
        free = end
        i = j
    if firsts:
        idx = np.repeat(np.asarray(firsts), sizes) + (
            np.arange(sum(sizes)) - np.repeat(np.cumsum(sizes) - sizes, sizes))
        fin[idx] = np.repeat(np.asarray(ends), sizes)
        lat[idx] = fin[idx] - arr[idx]
    batches = len(firsts)
    return ReplicaRun(lat, fin, batches)


def percentile_latency_s(latency_s: np.ndarray, percentile: float) -> float:
    """The ``percentile`` of served requests' latency, dropped ones counted as infinitely late."""
    if len(latency_s) == 0:
        return 0.0
    filled = np.where(np.isnan(latency_s), np.inf, latency_s)
    return float(np.percentile(filled, percentile, method="higher"))
