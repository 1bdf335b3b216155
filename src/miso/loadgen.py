"""The load generator of ``miso load``: open-loop arrivals at a service URL.

Arrivals come from a trace (the Azure LLM inference CSV's ``TIMESTAMP`` column, or a generic
``timestamp[,size]`` CSV / JSONL with seconds), sped up ``rate_x`` times, or from a rate
schedule (Poisson arrivals whose rate moves linearly through the points of a ramp). They are
open-loop: a request is sent at its time whatever the earlier ones do; at most ``concurrency``
are in flight (an arrival beyond that is counted ``dropped``, never queued in the client).
Every request's send time, latency and status are kept; :func:`summarize` gives the summary
``miso load --json`` prints and :func:`plot` the latency-over-time figure.

HTTP/1.1 keep-alive on plain asyncio streams (a Python client must spend little CPU per request
to offer thousands per second on a small machine).
"""

from __future__ import annotations

import asyncio
import csv
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

MAX_REQUESTS = 2_000_000
WINDOW_S = 10.0


@dataclass
class Sample:
    sent: float  # seconds since the start
    latency_s: float
    status: int  # HTTP status; 0 = connection error


@dataclass
class LoadResult:
    samples: list[Sample] = field(default_factory=list)
    dropped: int = 0  # arrivals over the concurrency bound
    #: the schedule time the client had reached when its time was up (None: it kept up)
    cut_at_s: float | None = None
    replicas: list[tuple[float, int]] = field(default_factory=list)  # (t, ready replicas)
    offered: list[tuple[float, float]] = field(default_factory=list)  # (t, rate)


def read_trace(path: str | Path, rate_x: float = 1.0, limit: int = MAX_REQUESTS) -> list[float]:
    """Arrival times (s from the first request) of a trace, divided by ``rate_x``."""
    p = Path(path)
    times: list[float] = []
    with p.open() as f:
        if p.suffix == ".jsonl":
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    times.append(float(rec["timestamp"] if isinstance(rec, dict) else rec[0]))
                if len(times) >= limit:
                    break
        else:
            rows = csv.reader(f)
            header = next(rows)
            col = 0
            if header and header[0].strip().upper() == "TIMESTAMP":
                for row in rows:
                    times.append(_timestamp(row[col]))
                    if len(times) >= limit:
                        break
            else:  # no header: the first line is data
                for row in [header, *rows]:
                    times.append(float(row[col]))
                    if len(times) >= limit:
                        break
    if not times:
        raise ValueError(f"{p}: no requests")
    t0 = min(times)
    return sorted((t - t0) / rate_x for t in times)


def _timestamp(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if "." in text:  # the Azure trace has 7 fractional digits; datetime takes 6
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


def ramp_arrivals(points: Sequence[float], base_rps: float, duration_s: float,
                  seed: int = 0) -> Iterator[float]:
    """Poisson arrivals whose rate goes linearly through ``points`` x ``base_rps`` (evenly
    spaced over ``duration_s``); by thinning a Poisson process at the peak rate. Lazy: a
    ramp at tens of thousands of requests/s is never held in memory."""
    rate = ramp_rate(points, base_rps, duration_s)
    peak = max(points) * base_rps
    rng = random.Random(seed)
    t = 0.0
    while peak > 0:
        t += rng.expovariate(peak)
        if t >= duration_s:
            return
        if rng.random() * peak <= rate(t):
            yield t


def ramp_rate(points: Sequence[float], base_rps: float,
              duration_s: float) -> Callable[[float], float]:
    xs = np.linspace(0.0, duration_s, len(points)) if len(points) > 1 else np.array([0.0])
    ys = np.array(points, dtype=float) * base_rps

    def rate(t: float) -> float:
        return float(np.interp(t, xs, ys))

    return rate


async def _request(pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], host: str,
                   port: int, data: bytes) -> int:
    conn = pool.pop() if pool else await asyncio.open_connection(host, port)
    reader, writer = conn
    try:
        writer.write(data)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        n = 0
        close = False
        for h in head.split(b"\r\n")[1:]:
            k, _, v = h.partition(b":")
            if k.strip().lower() == b"content-length":
                n = int(v)
            elif k.strip().lower() == b"connection" and v.strip().lower() == b"close":
                close = True
        if n:
            await reader.readexactly(n)
    except BaseException:
        writer.transport.abort()
        raise
    if close:
        writer.close()
    else:
        pool.append(conn)
    return status


async def run_load(url: str, arrivals: Iterable[float], *, concurrency: int = 512,
                   timeout_s: float = 30.0, body: bytes = b"{}",
                   on_tick: Callable[[float], Any] | None = None,
                   tick_s: float = 2.0, end_s: float | None = None) -> LoadResult:
    """Send one request at each arrival time (s from now); ``on_tick(t)`` runs every
    ``tick_s`` (e.g. to read the service's replicas). With ``end_s``, nothing is sent after
    ``end_s`` s: a client that fell behind its schedule stops on time, and the arrivals it
    did not send are reported (``cut_at_s``: how far into its schedule it got), not silently
    spread over a longer run."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"need an http:// URL, got {url!r}")
    port = u.port or 80
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    data = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    res = LoadResult()
    pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    inflight = 0
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()

    async def one(sent: float) -> None:
        nonlocal inflight
        t0 = time.monotonic()
        try:
            status = await asyncio.wait_for(_request(pool, u.hostname or "", port, data),
                                            timeout_s)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError, IndexError):
            status = 0
        finally:
            inflight -= 1
        res.samples.append(Sample(sent, time.monotonic() - t0, status))

    async def ticker() -> None:
        while True:
            if on_tick is not None:
                try:
                    r = on_tick(time.monotonic() - start)
                    if asyncio.iscoroutine(r):
                        await r
                except Exception:  # noqa: BLE001 - a status read failing must not stop the load
                    pass
            await asyncio.sleep(tick_s)

    tick = asyncio.create_task(ticker())
    behind = 0
    for t in arrivals:
        if end_s is not None and time.monotonic() - start > end_s:
            res.cut_at_s = t
            break
        delay = start + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:  # the client is behind its schedule: let the requests in flight progress
            behind += 1
            if behind % 64 == 0:
                await asyncio.sleep(0)
        if inflight >= concurrency:
            res.dropped += 1
            continue
        inflight += 1
        task = asyncio.create_task(one(t))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    tick.cancel()
    for _, w in pool:
        w.close()
    return res


def summarize(res: LoadResult, slo_ms: float | None = None,
              window_s: float = WINDOW_S) -> dict[str, Any]:
    """``requests``, ``errors`` (non-2xx or connection errors, plus client drops), ``p50_ms``,
    ``p99_ms``, ``windows_within_slo`` (share of ``window_s`` windows after the first
    scale-out whose p99 is within the SLO; over all windows when there was none),
    ``max_replicas`` and ``scale_outs`` / ``scale_ins`` seen."""
    s = sorted(res.samples, key=lambda x: x.sent)
    lat = np.array([x.latency_s * 1000.0 for x in s]) if s else np.zeros(0)
    ok = np.array([200 <= x.status < 300 for x in s], dtype=bool)
    sent = np.array([x.sent for x in s])
    out: dict[str, Any] = {
        "requests": len(s) + res.dropped, "errors": int((~ok).sum()) + res.dropped,
        "dropped": res.dropped,
        # the client could not keep to its schedule: the load it offered stopped here (s)
        "cut_at_s": res.cut_at_s,
        "p50_ms": round(float(np.percentile(lat, 50)), 3) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 3) if len(lat) else None,
        "slo_p99_ms": slo_ms,
    }
    reps = res.replicas
    out["max_replicas"] = max((n for _, n in reps), default=None)
    outs = [t for (t, n), (_, m) in zip(reps[1:], reps[:-1], strict=False) if n > m]
    ins = [t for (t, n), (_, m) in zip(reps[1:], reps[:-1], strict=False) if n < m]
    out["scale_outs"], out["scale_ins"] = len(outs), len(ins)
    first_out = outs[0] if outs else 0.0
    within, windows = 0, 0
    if len(sent) and slo_ms is not None:
        end = float(sent[-1])
        w0 = first_out
        while w0 < end:
            m = (sent >= w0) & (sent < w0 + window_s)
            if m.any():
                windows += 1
                wl = np.where(ok[m], lat[m], 1e12)  # an error is a miss
                within += int(float(np.percentile(wl, 99)) <= slo_ms)
            w0 += window_s
    out["windows"] = windows
    out["windows_within_slo"] = round(within / windows, 4) if windows else None
    if slo_ms is not None and len(lat):
        out["attainment"] = round(float((ok & (lat <= slo_ms)).mean()), 5)
    return out


def plot(res: LoadResult, path: str | Path, slo_ms: float | None = None,
         window_s: float = 1.0) -> None:
    """Latency (p50, p99 per ``window_s``) and the offered rate / ready replicas over time."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    s = sorted(res.samples, key=lambda x: x.sent)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    if s:
        sent = np.array([x.sent for x in s])
        lat = np.array([x.latency_s * 1000 for x in s])
        edges = np.arange(0.0, sent[-1] + window_s, window_s)
        ts, p50, p99, rate = [], [], [], []
        for a in edges:
            m = (sent >= a) & (sent < a + window_s)
            if m.any():
                ts.append(a)
                p50.append(np.percentile(lat[m], 50))
                p99.append(np.percentile(lat[m], 99))
                rate.append(m.sum() / window_s)
        ax.plot(ts, p50, label="p50")
        ax.plot(ts, p99, label="p99")
        ax2.plot(ts, rate, label="requests/s", color="tab:gray")
    if slo_ms is not None:
        ax.axhline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.legend(loc="upper left")
    if res.replicas:
        ax3 = ax2.twinx()
        ax3.step([t for t, _ in res.replicas], [n for _, n in res.replicas], where="post",
                 color="tab:green", label="ready replicas")
        ax3.set_ylabel("ready replicas")
        ax3.legend(loc="upper right")
    ax2.set_ylabel("requests/s")
    ax2.set_xlabel("time (s)")
    ax2.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
