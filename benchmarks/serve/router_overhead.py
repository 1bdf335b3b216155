"""What the service router adds to a request, with 1,000 client connections held open.

Three processes on loopback: a replica (``python -m miso.emuserve --slow 0``: it answers at
once), the router (``miso.serving.router.RouterServer`` with that replica) and this client.
The client opens ``--connections`` keep-alive connections, keeps them all open, and sends
open-loop requests at ``--rate`` per second spread over them for ``--duration`` seconds, first
to the replica directly, then through the router; it prints p50/p99 of both and the p99 the
router adds. Target (issue 29): 1,000 connections held, <= 2 ms p99 added.

With ``--rounds N`` the two are measured N times each, alternating (direct, router, direct,
...), so a machine whose load drifts (a shared one) weighs on both alike; the per-round
figures and their medians are printed. ``router_cpu_us_per_request`` is the router process's
own CPU time (user + system, from /proc) per request it served: what the router costs
whatever else the machine runs.

    python benchmarks/serve/router_overhead.py --connections 1000 --rate 500 --duration 20 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time

import numpy as np

ROUTER = """
import sys, time
from miso.serving.router import RouterServer
rs = RouterServer().start()
rs.router.add_service("bench", 100.0)
rs.router.add_replica("bench", "r1", "127.0.0.1", int(sys.argv[1]), "7g.40gb")
print(rs.port, flush=True)
while True:
    time.sleep(3600)
"""


async def _open(host: str, port: int, n: int) -> list[tuple[asyncio.StreamReader,
                                                            asyncio.StreamWriter]]:
    conns = []
    for i in range(0, n, 100):
        conns += await asyncio.gather(*(asyncio.open_connection(host, port)
                                        for _ in range(min(100, n - i))))
    return conns


async def _one(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], path: str,
               lat: list[float], errors: list[int]) -> None:
    reader, writer = conn
    t0 = time.perf_counter()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n".encode()
                 + b"0123456789abcdef")
    head = await reader.readuntil(b"\r\n\r\n")
    n = int(next(h.split(b":")[1] for h in head.split(b"\r\n")
                 if h.lower().startswith(b"content-length")))
    await reader.readexactly(n)
    lat.append(time.perf_counter() - t0)
    if not head.startswith(b"HTTP/1.1 200"):
        errors.append(1)


async def measure(port: int, path: str, connections: int, rate: float,
                  duration: float, cpu_of: int | None = None) -> dict[str, float]:
    """Open-loop requests over ``connections`` held connections; with ``cpu_of`` (a pid),
    that process's CPU seconds while the requests ran (connections open) as ``cpu_s``."""
    conns = await _open("127.0.0.1", port, connections)
    c0 = cpu_s(cpu_of) if cpu_of else 0.0
    free = list(conns)
    random.shuffle(free)
    lat: list[float] = []
    errors: list[int] = []
    tasks = set()
    rng = random.Random(1)
    start = time.perf_counter()
    nxt = start
    busy_skips = 0

    async def run(c: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        await _one(c, path, lat, errors)
        free.append(c)

    while nxt - start < duration:
        await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
        if free:
            t = asyncio.create_task(run(free.pop(0)))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        else:
            busy_skips += 1
        nxt += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    used = cpu_s(cpu_of) - c0 if cpu_of else 0.0
    held = sum(1 for _, w in conns if not w.is_closing())
    for _, w in conns:
        w.close()
    a = np.array(lat) * 1000
    return {"requests": len(lat), "errors": len(errors), "held": held,
            "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "skipped": busy_skips,
            "cpu_s": round(used, 4)}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--rate", type=float, default=500.0)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rep = subprocess.Popen([sys.executable, "-m", "miso.emuserve", "--model", "resnet50",
                            "--port", "0", "--slow", "0", "--load-s", "0"],
                           stdout=subprocess.PIPE, text=True)
    router = None
    try:
        port = json.loads(rep.stdout.readline())["port"]
        router = subprocess.Popen([sys.executable, "-c", ROUTER, str(port)],
                                  stdout=subprocess.PIPE, text=True)
        rport = int(router.stdout.readline())
        rounds = []
        cpu, served = 0.0, 0
        for _ in range(max(1, a.rounds)):
            direct = asyncio.run(measure(port, "/infer", a.connections, a.rate, a.duration))
            routed = asyncio.run(measure(rport, "/s/bench/infer", a.connections, a.rate,
                                         a.duration, cpu_of=router.pid))
            cpu += routed["cpu_s"]
            served += routed["requests"]
            rounds.append({"direct_p99_ms": direct["p99_ms"], "router_p99_ms": routed["p99_ms"],
                           "added_p50_ms": round(routed["p50_ms"] - direct["p50_ms"], 3),
                           "added_p99_ms": round(routed["p99_ms"] - direct["p99_ms"], 3)})
    finally:
        rep.kill()
        if router is not None:
            router.kill()
    out = {"connections": a.connections, "rate": a.rate, "duration_s": a.duration,
           "direct": direct, "router": routed,
           "added_p50_ms": round(routed["p50_ms"] - direct["p50_ms"], 3),
           "added_p99_ms": round(routed["p99_ms"] - direct["p99_ms"], 3),
           "rounds": rounds,
           "median_added_p50_ms": statistics.median(r["added_p50_ms"] for r in rounds),
           "median_added_p99_ms": statistics.median(r["added_p99_ms"] for r in rounds),
           "router_cpu_us_per_request": round(1e6 * cpu / max(1, served), 1),
           "load_average": os.getloadavg()[0]}
    print(json.dumps(out, indent=None if a.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
