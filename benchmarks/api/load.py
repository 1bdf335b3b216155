"""Load benchmark of the HTTP API: N concurrent clients submitting, listing and reading status.

The server is what the cluster head runs: the real app (:func:`miso.api.head.serve`) over the
real controller on emulated GPUs (:class:`miso.cluster.local.LocalCluster`, real job
processes), in its own process, on 127.0.0.1 only. The clients (threads of one process, one
keep-alive connection, user and token each) run closed loops for ``--duration`` seconds: submitters
submit ``sleep`` jobs as fast as answers come, the others alternate status and job listings.
At the end every id answered to a submit must be in the store exactly once (no job lost or
duplicated) and every request must have succeeded.

    python benchmarks/api/load.py --clients 16 --submitters 8 --duration 30

Bounded: at most 64 clients, 120 s, 20,000 submits (then the submitters stop).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MAX_CLIENTS, MAX_DURATION, MAX_SUBMITS = 64, 120.0, 20_000


# ---- the server process ----------------------------------------------------------------------


def serve_main(state: Path, users: int, gpus: int, policy: str | None, observe: bool) -> int:
    from miso.api.head import serve, users_of
    from miso.cluster.local import LocalCluster
    from miso.controller import ControllerConfig

    cfg = ControllerConfig(**({"policy": policy} if policy else {}))
    lc = LocalCluster(state, gpus_per_node=gpus, config=cfg)
    store = users_of(state)
    tokens = {"admin": store.add("admin", admin=True)}
    for i in range(users):
        tokens[f"u{i:02d}"] = store.add(f"u{i:02d}")
    store.close()
    extra: dict[str, Any] = {}
    if observe:  # as the head serves it: metrics, decision log, their routes and middleware
        from miso.observe import attach
        from miso.observe.routes import api_routers, instrument

        obs = attach(lc.controller, state)
        extra = {"extra_routers": api_routers(lc.controller, obs),
                 "setup": lambda app: instrument(app, obs)}
    srv = serve(lc.controller, state, {"host": "127.0.0.1", "port": 0}, **extra)
    fd = os.open(state / "bench.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": srv.url, "tokens": tokens}, f)
    done = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: done.update(flag=True))
    while not done["flag"]:
        time.sleep(0.2)
    srv.stop()
    lc.close()
    return 0


# ---- the clients -----------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (its threads; not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_clients(url: str, tokens: dict[str, str], clients: int, submitters: int,
                duration: float) -> dict[str, Any]:
    """Closed-loop clients, one thread and one keep-alive connection each (the standard
    library's http.client: the lightest client, so the load generator leaves the CPU to the
    server on a small machine)."""
    import http.client
    import threading
    from urllib.parse import urlsplit

    host = urlsplit(url)
    lat: dict[str, list[float]] = {"submit": [], "status": [], "list": []}
    errors: list[str] = []
    ids: list[str] = []
    lock = threading.Lock()
    names = sorted(k for k in tokens if k != "admin")
    t_end = time.perf_counter() + duration

    def one(i: int) -> None:
        user = names[i % len(names)]
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
        hdr = {"Authorization": f"Bearer {tokens[user]}", "Content-Type": "application/json"}
        n = 0
        while time.perf_counter() < t_end:
            n += 1
            if i < submitters and len(ids) < MAX_SUBMITS:
                op, method, path = "submit", "POST", "/api/v1/jobs"
                body: bytes | None = json.dumps({"command": ["sleep", "600"], "memory_gb": 4,
                                                 "name": f"{user}-{i}-{n}"}).encode()
            elif n % 2:
                op, method, path, body = "status", "GET", "/api/v1/status?limit=20", None
            else:
                op, method, path, body = "list", "GET", "/api/v1/jobs?limit=50", None
            t0 = time.perf_counter()
            try:
                conn.request(method, path, body=body, headers=hdr)
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    errors.append(f"{op}: {type(e).__name__}: {e}")
                conn.close()
                conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
                continue
            dt = time.perf_counter() - t0
            with lock:
                lat[op].append(dt)
                if r.status >= 300:
                    errors.append(f"{op}: {r.status} {data[:80]!r}")
                elif op == "submit":
                    ids.append(json.loads(data)["id"])
        conn.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    import httpx

    stored = httpx.get(url + "/api/v1/jobs", params={"all": True}, timeout=120, headers={
        "Authorization": f"Bearer {tokens['admin']}"}).json()["jobs"]
    stored_ids = [j["id"] for j in stored]
    return {
        "clients": clients, "submitters": submitters, "wall_s": round(wall, 1),
        "requests": sum(len(v) for v in lat.values()), "errors": len(errors),
        "error_examples": errors[:5],
        "ops": {op: {"n": len(v), "per_s": round(len(v) / wall, 1),
                     "p50_ms": round(1000 * pct(v, 0.50), 1),
                     "p99_ms": round(1000 * pct(v, 0.99), 1)} for op, v in lat.items()},
        "submitted": len(ids), "stored": len(stored_ids),
        "lost": len(set(ids) - set(stored_ids)),
        "duplicated": len(ids) - len(set(ids)) + len(stored_ids) - len(set(stored_ids)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--submitters", type=int, default=8, help="clients that only submit")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--gpus", type=int, default=4, help="emulated GPUs of the cluster")
    ap.add_argument("--policy", help="scheduling policy of the controller (default: its own)")
    ap.add_argument("--observe", action="store_true",
                    help="with the observability side attached, as the cluster head runs it")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--users", type=int, default=16, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        return serve_main(Path(a.serve), a.users, a.gpus, a.policy, a.observe)
    if not (1 <= a.clients <= MAX_CLIENTS and 0 <= a.submitters <= a.clients
            and 0 < a.duration <= MAX_DURATION):
        ap.error(f"need 1 <= --clients <= {MAX_CLIENTS}, --submitters <= --clients, "
                 f"0 < --duration <= {MAX_DURATION:g}")
    state = Path(tempfile.mkdtemp(prefix="miso-apibench-"))
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(state), "--users",
                             str(a.clients), "--gpus", str(a.gpus),
                             *(["--policy", a.policy] if a.policy else []),
                             *(["--observe"] if a.observe else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.time() + 60
        while not (state / "bench.json").exists():
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"server did not start: {proc.stderr.read().decode()[-500:]}"
                                 if proc.stderr else "server did not start")
            time.sleep(0.1)
        time.sleep(0.2)
        info = json.loads((state / "bench.json").read_text())
        assert info["url"].startswith("http://127.0.0.1:"), info["url"]  # loopback only
        cpu0, cpu_c0 = cpu_s(proc.pid), time.process_time()
        res = run_clients(info["url"], info["tokens"], a.clients, a.submitters, a.duration)
        server_cpu, client_cpu = cpu_s(proc.pid) - cpu0, time.process_time() - cpu_c0
        res["cpu_ms_per_request"] = {"server": round(1000 * server_cpu / res["requests"], 2),
                                     "client": round(1000 * client_cpu / res["requests"], 2)}
        res["policy"] = a.policy or "default"
        res["observe"] = a.observe
        res["load_avg"] = [round(x, 2) for x in os.getloadavg()]
        res["cpus"] = os.cpu_count()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        import shutil

        shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(res, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["errors"] == 0 and res["lost"] == 0 and res["duplicated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
