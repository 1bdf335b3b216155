"""A sliding window of request latencies: rate, p50/p99 and SLO attainment over the last
minutes (the live rate signal of a service). Bounded in time and in count."""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

import numpy as np

KEEP_S = 600.0
MAX_SAMPLES = 500_000


class LatencyWindow:
    """(time, latency s, ok) of the last :data:`KEEP_S` seconds, at most :data:`MAX_SAMPLES`."""

    def __init__(self, keep_s: float = KEEP_S, max_samples: int = MAX_SAMPLES) -> None:
        self.keep_s = keep_s
        self.samples: deque[tuple[float, float, bool]] = deque(maxlen=max_samples)
        self.total = 0

    def add(self, now: float, latency_s: float, ok: bool) -> None:
        self.samples.append((now, latency_s, ok))
        self.total += 1
        while self.samples and self.samples[0][0] < now - self.keep_s:
            self.samples.popleft()

    def summary(self, now: float, window_s: float = 60.0,
                slo_ms: float | None = None) -> dict[str, Any]:
        """``rate`` (requests/s over the window), ``p50_ms``, ``p99_ms``, ``errors`` and
        ``attainment`` (share of requests that succeeded within the SLO; None without one)."""
        snap = list(self.samples)  # one C-level copy: the router's thread appends meanwhile
        recent = snap[bisect.bisect_left(snap, now - window_s, key=lambda s: s[0]):]
        out: dict[str, Any] = {"window_s": window_s, "requests": len(recent),
                               "rate": len(recent) / window_s, "p50_ms": None,
                               "p99_ms": None, "errors": 0, "attainment": None}
        if not recent:
            return out
        lat = np.array([s[1] for s in recent]) * 1000.0
        ok = np.array([s[2] for s in recent], dtype=bool)
        out["p50_ms"] = round(float(np.percentile(lat, 50)), 3)
        out["p99_ms"] = round(float(np.percentile(lat, 99)), 3)
        out["errors"] = int((~ok).sum())
        if slo_ms is not None:
            out["attainment"] = round(float((ok & (lat <= slo_ms)).mean()), 5)
        return out
