"""Request-arrival traces for services: loaders, rescaling and synthetic generators.

A trace is a sorted array of arrival times (seconds from 0) and an optional per-request size
(generated tokens for the Azure LLM traces, 1 otherwise). Loaders read the shipped Azure LLM
inference trace 2023 (CC BY 4.0, attribution in ``miso/data/serving/NOTICE.md``) and generic
``timestamp[,size]`` CSV or JSONL (timestamps in seconds, or ISO dates). Rescaling: a rate
multiplier (thinning or superposing shifted copies) and time compression.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path

import numpy as np

#: Bound on the requests a loaded trace may hold (a hostile file cannot exhaust memory).
MAX_REQUESTS = 5_000_000

AZURE_TRACES = ("conv", "code")


@dataclass(frozen=True)
class RequestTrace:
    """Arrival times (s from 0, sorted) and per-request sizes of one request stream."""

    name: str
    arrivals_s: np.ndarray
    sizes: np.ndarray

    @property
    def duration_s(self) -> float:
        return float(self.arrivals_s[-1]) if len(self.arrivals_s) else 0.0

    def rate_per_window(self, window_s: float, until_s: float | None = None) -> np.ndarray:
        """Mean request rate (req/s) in each ``window_s`` window from 0."""
        end = self.duration_s if until_s is None else until_s
        n = max(1, math.ceil(end / window_s))
        counts = np.bincount((self.arrivals_s // window_s).astype(int), minlength=n)[:n]
        return counts / window_s

    def compressed(self, factor: float) -> RequestTrace:
        """Time compressed by ``factor`` (2 = the same requests in half the time, twice the
        rate, same burst shape)."""
        if factor <= 0:
            raise ValueError("compression factor must be > 0")
        return RequestTrace(f"{self.name}/x{factor:g}t", self.arrivals_s / factor, self.sizes)

    def scaled(self, multiplier: float, seed: int = 0) -> RequestTrace:
        """Rate multiplied by ``multiplier`` over the same span: below 1 keeps each request
        with that probability; above 1 adds copies of the trace shifted by random offsets
        (each copy keeps the burst shape) and thins the last copy."""
        if multiplier <= 0:
            raise ValueError("rate multiplier must be > 0")
        rng = np.random.default_rng(seed)
        span = max(self.duration_s, 1e-9)
        parts_a, parts_s = [], []
        whole = int(math.floor(multiplier))
        frac = multiplier - whole
        for k in range(whole):
            shift = 0.0 if k == 0 else rng.uniform(0, span)
            parts_a.append((self.arrivals_s + shift) % span)
            parts_s.append(self.sizes)
        if frac > 1e-9:
            keep = rng.random(len(self.arrivals_s)) < frac
            shift = rng.uniform(0, span) if whole else 0.0
            parts_a.append((self.arrivals_s[keep] + shift) % span)
            parts_s.append(self.sizes[keep])
        a = np.concatenate(parts_a)
        s = np.concatenate(parts_s)
        order = np.argsort(a, kind="stable")
        return RequestTrace(f"{self.name}/x{multiplier:g}r", a[order], s[order])

    def window(self, start_s: float, end_s: float) -> RequestTrace:
        """Requests arriving in [start_s, end_s), shifted to start at 0."""
        m = (self.arrivals_s >= start_s) & (self.arrivals_s < end_s)
        return RequestTrace(self.name, self.arrivals_s[m] - start_s, self.sizes[m])


def _parse_time(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    # Azure: "2023-11-16 18:15:46.6805900" (100 ns digits): keep microseconds
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


def _finish(name: str, times: list[float], sizes: list[float]) -> RequestTrace:
    if not times:
        raise ValueError(f"trace {name}: no requests")
    a = np.asarray(times, dtype=float)
    s = np.asarray(sizes, dtype=float)
    if not np.all(np.isfinite(a)) or not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError(f"trace {name}: non-finite time or negative size")
    order = np.argsort(a, kind="stable")
    a = a[order] - a[order][0]
    return RequestTrace(name, a, s[order])


def azure_llm_trace(which: str = "conv") -> RequestTrace:
    """The shipped Azure LLM inference trace 2023 (``conv`` or ``code``); size = generated
    tokens. CC BY 4.0, Patel et al., Splitwise (ISCA 2024)."""
    if which not in AZURE_TRACES:
        raise ValueError(f"unknown Azure trace {which!r}; known: {', '.join(AZURE_TRACES)}")
    ref = resources.files("miso.data").joinpath(f"serving/AzureLLMInferenceTrace_{which}.csv.gz")
    text = gzip.decompress(ref.read_bytes()).decode()
    return parse_azure_csv(text, name=f"azure-{which}")


def parse_azure_csv(text: str, name: str = "azure") -> RequestTrace:
    """Parse ``TIMESTAMP,ContextTokens,GeneratedTokens`` rows (size = generated tokens)."""
    times: list[float] = []
    sizes: list[float] = []
    reader = csv.DictReader(io.StringIO(text))
    for row in reader:
        if len(times) >= MAX_REQUESTS:
            raise ValueError(f"trace {name}: more than {MAX_REQUESTS} requests")
        times.append(_parse_time(row["TIMESTAMP"]))
        sizes.append(float(row.get("GeneratedTokens") or 1.0))
    return _finish(name, times, sizes)


def load_trace(path: str | Path) -> RequestTrace:
    """A generic trace file: CSV ``timestamp[,size]`` (a header row is optional; Azure's
    columns are recognised) or JSONL ``{"timestamp": t, "size": s}`` per line (``.jsonl``).
    Timestamps are seconds (any origin) or ISO dates; size defaults to 1."""
    p = Path(path)
    raw = p.read_bytes()
    if p.suffix == ".gz":
        raw = gzip.decompress(raw)
        p = p.with_suffix("")
    text = raw.decode()
    name = p.stem
    if p.suffix == ".jsonl":
        times, sizes = [], []
        for line in text.splitlines():
            if not line.strip():
                continue
            if len(times) >= MAX_REQUESTS:
                raise ValueError(f"trace {name}: more than {MAX_REQUESTS} requests")
            obj = json.loads(line)
            if not isinstance(obj, dict) or "timestamp" not in obj:
                raise ValueError(f"trace {name}: each line needs a 'timestamp'")
            times.append(_parse_time(str(obj["timestamp"])))
            sizes.append(float(obj.get("size", 1.0)))
        return _finish(name, times, sizes)
    first = text.split("\n", 1)[0]
    if "TIMESTAMP" in first:
        return parse_azure_csv(text, name=name)
    times, sizes = [], []
    for i, row in enumerate(csv.reader(io.StringIO(text))):
        if not row or not row[0].strip():
            continue
        if len(times) >= MAX_REQUESTS:
            raise ValueError(f"trace {name}: more than {MAX_REQUESTS} requests")
        try:
            t = _parse_time(row[0])
        except ValueError:
            if i == 0:
                continue  # header
            raise ValueError(f"trace {name}: bad timestamp on row {i + 1}") from None
        times.append(t)
        sizes.append(float(row[1]) if len(row) > 1 and row[1].strip() else 1.0)
    return _finish(name, times, sizes)


def poisson_trace(rate_of, duration_s: float, seed: int = 0, name: str = "synthetic",
                  step_s: float = 1.0) -> RequestTrace:
    """Non-homogeneous Poisson arrivals with rate ``rate_of(t)`` (req/s), piecewise constant
    per ``step_s``."""
    rng = np.random.default_rng(seed)
    parts = []
    t = 0.0
    while t < duration_s:
        lam = max(0.0, float(rate_of(t)))
        n = rng.poisson(lam * step_s)
        parts.append(np.sort(t + rng.uniform(0, step_s, n)))
        t += step_s
    a = np.concatenate(parts) if parts else np.zeros(0)
    return RequestTrace(name, a, np.ones(len(a)))


def diurnal_trace(mean_rps: float, duration_s: float, peak_to_trough: float = 4.0,
                  period_s: float = 86_400.0, seed: int = 0) -> RequestTrace:
    """A synthetic day: a sinusoid whose peak is ``peak_to_trough`` x its trough, averaging
    ``mean_rps``, trough at t = 0."""
    r = peak_to_trough
    lo = 2.0 * mean_rps / (1.0 + r)
    amp = (r - 1.0) * lo / 2.0

    def rate(t: float) -> float:
        return lo + amp * (1.0 - math.cos(2.0 * math.pi * t / period_s))

    return poisson_trace(rate, duration_s, seed, name=f"diurnal-{r:g}x",
                         step_s=max(1.0, period_s / 1440))


def step_trace(base_rps: float, duration_s: float, step_at_s: float, factor: float = 5.0,
               step_len_s: float | None = None, seed: int = 0) -> RequestTrace:
    """A burst: ``base_rps``, then ``factor`` x from ``step_at_s`` (for ``step_len_s``, or to
    the end)."""
    end = duration_s if step_len_s is None else step_at_s + step_len_s

    def rate(t: float) -> float:
        return base_rps * (factor if step_at_s <= t < end else 1.0)

    return poisson_trace(rate, duration_s, seed, name=f"step-{factor:g}x")
