"""Issue 29's ramp on an in-process emulated cluster (no Ray): training first, then a service
driven 1x -> 6x -> 1x of one replica's capacity; the load generator in a process of its own.

The controller and agents run in this process (``LocalCluster``), the router, every replica
(``python -m miso.emuserve``) and every training job in processes of their own, the load
generator (:mod:`miso.loadgen`) in a child process. Prints the summary JSON (the keys of
``miso load --json``, plus the replica timeline, the training jobs' checkpoints and resumes).
Used by tests/test_services_replay.py (and its simulated replay) and by hand:

    flock /tmp/miso-heavy.lock python benchmarks/serve/ramp_local.py --duration 180 --json F
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from miso import loadgen
from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig
from miso.controller.services import attach_services
from miso.controller.servicestore import ServiceRecord

LOADER = """
import asyncio, json, sys
from miso import loadgen
url, points, base, duration, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), \\
    float(sys.argv[4]), sys.argv[5]
pts = [float(x) for x in points.split(",")]
res = asyncio.run(loadgen.run_load(url, loadgen.ramp_arrivals(pts, base, duration),
                                   concurrency=512, end_s=duration + 5.0))
with open(out, "w") as f:
    json.dump({"samples": [[s.sent, s.latency_s, s.status] for s in res.samples],
               "dropped": res.dropped, "cut_at_s": res.cut_at_s}, f)
"""


def training(iterations: int, ips: float) -> list[str]:
    return [sys.executable, "-m", "miso.emuworkload", "--workload", "resnet_train128",
            "--iterations", str(iterations), "--ips", str(ips)]


def run(state_dir: str | Path, *, duration: float = 180.0, points: str = "1,6,1",
        gpus: int = 4, training_jobs: int = 4, slo_ms: float = 100.0,
        model: str = "resnet50", plot: str | None = None, server_args: tuple[str, ...] = (),
        keep_samples: bool = False) -> dict[str, Any]:
    """One run; the summary (with ``keep_samples``, also ``sent_s``: every request's send
    time, and ``ready_delays_s``: each replica's time from its start to ready)."""
    d = Path(state_dir)
    cfg = ControllerConfig(poll_interval=0.2, profile_seconds_per_level=0.5,
                           checkpoint_timeout=10.0)
    c = LocalCluster(d, config=cfg, gpus_per_node=gpus, rate_window=0.5)
    assert c.controller is not None
    mgr = attach_services(c.controller, d)
    ctl = c.controller
    train = [ctl.submit(training(10**6, 40.0), name=f"train{i}") for i in range(training_jobs)]
    timeline: list[tuple[float, int, int]] = []  # (t, ready replicas, replicas)
    try:
        t_end = time.time() + 120
        while time.time() < t_end and not all(ctl.store.get(j).state == "running"
                                               for j in train):
            time.sleep(0.5)
        view = mgr.serve(ServiceRecord(
            name="bars-svc", model=model, slo_p99_ms=slo_ms, owner=None,
            command=[sys.executable, "-m", "miso.emuserve", "--model", model, *server_args]))
        t_end = time.time() + 120
        while time.time() < t_end and mgr.view("bars-svc")["ready_replicas"] < 1:
            time.sleep(0.5)
        v = mgr.view("bars-svc")
        base = float(v["capacity_rps"])
        out_file = d / "load.json"
        loader = subprocess.Popen([sys.executable, "-c", LOADER, view["url"], points, str(base),
                                   str(duration), str(out_file)])
        t0 = time.time()
        while loader.poll() is None:
            v = mgr.view("bars-svc")
            timeline.append((time.time() - t0, v["ready_replicas"],
                             len([r for r in v["replicas"] if r["state"] != "draining"])))
            time.sleep(1.0)
        raw = json.loads(out_file.read_text())
        res = loadgen.LoadResult(
            samples=[loadgen.Sample(s, lat, st) for s, lat, st in raw["samples"]],
            dropped=raw["dropped"], cut_at_s=raw["cut_at_s"],
            replicas=[(t, n) for t, n, _ in timeline])
        out = loadgen.summarize(res, slo_ms)
        if plot:
            loadgen.plot(res, plot, slo_ms)
            out["plot"] = plot
        # every checkpointed training job resumed (running again, or finished)
        t_end = time.time() + 90
        moved: list[Any] = []
        while time.time() < t_end:
            jobs = [ctl.store.get(j) for j in train]
            moved = [j for j in jobs if j.restarts > 0 or j.checkpoint_iteration]
            if all(j.state in ("running", "finished") for j in moved):
                break
            time.sleep(1.0)
        out.update({
            "base_rps": round(base, 2), "profile": mgr.view("bars-svc")["profile"],
            "duration_s": duration, "ramp": points,
            "timeline": [[round(t, 1), n, m] for t, n, m in timeline],
            "training_checkpointed": len(moved),
            "training_resumed": sum(j.state in ("running", "finished") for j in moved),
            "events": [e["text"] for e in mgr.view("bars-svc")["events"]],
        })
        if keep_samples:
            out["sent_s"] = [s.sent for s in res.samples]
            out["ready_delays_s"] = ready_delays(list(mgr.events["bars-svc"]))
            out["slowdown"] = mgr.scaling.expected_slowdown(mgr.services["bars-svc"])
            out["gpu_model"] = "A100-40GB"
        return out
    finally:
        mgr.close()
        mgr.server.stop()
        ctl.stop(stop_jobs=True)


def ready_delays(events: list[dict[str, Any]]) -> list[float]:
    """Seconds from 'started replica J' to 'replica J ready' in a service's events."""
    started: dict[str, float] = {}
    out = []
    for e in events:
        m = re.search(r"started replica (j\d+)", e["text"])
        if m:
            started[m.group(1)] = e["time"]
        m = re.match(r"replica (j\d+) ready", e["text"])
        if m and m.group(1) in started:
            out.append(e["time"] - started.pop(m.group(1)))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--duration", type=float, default=180.0)
    p.add_argument("--ramp", default="1,6,1")
    p.add_argument("--training", type=int, default=4, help="training jobs started first")
    p.add_argument("--plot", default=None)
    p.add_argument("--json", default=None, help="also write the summary here")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="miso-ramp-") as d:
        out = run(d, duration=a.duration, points=a.ramp, plot=a.plot,
                  training_jobs=a.training)
    text = json.dumps(out)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
