"""Overhead of the observability side: controller events/s and status latency with the metrics
and the decision log on vs off, plus the simulator's events/s and the scrape/view costs.

Live controller: the real :class:`~miso.controller.Controller` (loop, executor, poller, SQLite
store, the MISO policy with true speeds, no profiling) over ``--gpus`` emulated A100 GPUs
behind an in-process agent stand-in that answers at once (no job processes: the benchmark
measures the controller, not the jobs). A burst of ``--jobs`` submissions is handled until the
cluster settles (the jobs are stored first, their arrivals then posted to the loop at once);
events/s = events the loop handled / wall time from the burst to settled. Meanwhile a thread calls
``status()`` in a loop (its latency under load). On = :func:`miso.observe.attach` (metrics
registry + ``decisions.jsonl``), off = no observer. Runs alternate on/off; medians reported.

    python benchmarks/observe/bench_overhead.py [--gpus 64] [--jobs 448] [--repeats 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from miso.controller import Controller, ControllerConfig, JobStore
from miso.observe import DecisionLog, Metrics, Observer, attach, policy_estimates
from miso.observe.routes import make_app
from miso.sched import JobSpec, JobSubmitted

#: MISO with true speeds: every arrival re-partitions its GPU (up to 7 jobs a GPU), so the
#: loop sees placements, layouts, acknowledgements and checkpoint-restarts.
POLICY = "miso"


class InstantAgents:
    """A transport to one node of emulated GPUs that does everything at once: layouts are
    applied, jobs 'run' (no process) and checkpoint when asked."""

    def __init__(self, gpus: int, model: str = "A100-40GB") -> None:
        self.n, self.model = gpus, model
        self.layouts: dict[int, list[Any]] = {i: [] for i in range(gpus)}
        self.attempts: dict[tuple[str, int], str] = {}
        self.lock = threading.Lock()

    def nodes(self) -> list[str]:
        return ["node0"]

    def call(self, node: str, method: str, *args: Any, timeout: float = 30.0) -> Any:
        fn = getattr(self, "_" + method, None)
        return fn(*args) if fn is not None else None  # e.g. lease renewals: nothing to do

    def _describe(self, *_: Any) -> dict[str, Any]:
        return {"node": "node0", "backend": "instant", "pid": 0,
                "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": self.model, "mig": True,
                          "layout": self.layouts[i], "devices": {}, "driver": None,
                          "profiles": None} for i in range(self.n)]}

    def _apply_layout(self, gpu: int, layout: list[Any]) -> dict[str, Any]:
        self.layouts[gpu] = list(layout)
        return {"ok": True, "layout": list(layout), "error": "", "kind": ""}

    def _read_layout(self, gpu: int) -> list[Any]:
        return list(self.layouts[gpu])

    def _launch(self, spec: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.attempts[(spec["job"], spec["attempt"])] = "running"
        return {"ok": True}

    def _checkpoint(self, job: str, attempt: int) -> bool:
        with self.lock:
            self.attempts[(job, attempt)] = "checkpointed"
        return True

    _kill = _checkpoint

    def _forget(self, job: str, attempt: int) -> None:
        with self.lock:
            self.attempts.pop((job, attempt), None)

    def _report(self, *_: Any) -> dict[str, Any]:  # (the controller's lease, if any)
        with self.lock:
            jobs = [{"job": j, "attempt": a, "status": s, "returncode": 0 if s != "running"
                     else None} for (j, a), s in self.attempts.items()]
        return {"node": "node0", "time": time.time(), "jobs": jobs}

    def _stop_mps(self, gpu: int) -> None:
        return None

    def _shutdown(self) -> None:
        return None

    def _logs(self, job: str, tail: int = 200) -> str:
        return ""

    def _ping(self) -> str:
        return "ok"


class Timed:
    """The observer with the time spent in its hooks added up (to set against the loop's)."""

    def __init__(self, obs: Observer) -> None:
        self.obs = obs
        self.spent = 0.0

    def on_event(self, *a: Any) -> None:
        t0 = time.perf_counter()
        self.obs.on_event(*a)
        self.spent += time.perf_counter() - t0

    def on_decision(self, *a: Any) -> None:
        t0 = time.perf_counter()
        self.obs.on_decision(*a)
        self.spent += time.perf_counter() - t0

    def on_timing(self, name: str, seconds: float) -> None:
        self.obs.on_timing(name, seconds)


def handling_seconds(obs: Observer) -> float:
    """Sum of the loop's event-handling times the metrics recorded."""
    assert obs.metrics is not None
    for fam in obs.metrics.handle_s.collect():
        for smp in fam.samples:
            if smp.name.endswith("_sum"):
                return float(smp.value)
    return 0.0


def settled(ctl: Controller, n: int) -> bool:
    """All ``n`` submissions handled, nothing queued for the loop, no plan in flight."""
    def quiet() -> bool:
        st = ctl.status()
        return ctl.rt.queue.empty() and not ctl.executor.busy() and \
            not any(g["pending_plan"] for g in st["gpus"])

    got = sum(e["kind"] == "JobSubmitted" for e in ctl.store.events())
    if got < n or not quiet():
        return False
    time.sleep(0.05)  # and still quiet a moment later (no ack on its way)
    return quiet()


def one_run(observe: bool, gpus: int, jobs: int, root: Path) -> dict[str, float]:
    d = Path(tempfile.mkdtemp(dir=root))
    cfg = ControllerConfig(policy=POLICY, estimator="true", poll_interval=0.05,
                           checkpoint_timeout=5.0, check_commands=False)
    ctl = Controller(JobStore(d / "miso.db"), InstantAgents(gpus), cfg,
                     checkpoint_root=d / "ckpt")
    timed = None
    if observe:
        timed = Timed(attach(ctl, d))
        ctl.observer = timed
    ctl.start()
    deadline = time.time() + 60
    while time.time() < deadline and len(ctl.status()["gpus"]) < gpus:
        time.sleep(0.01)
    # the jobs are stored first, then their arrivals reach the loop as one burst: the timing
    # is the loop (and the plans it starts) working through them, not the SQLite inserts
    recs = [ctl.store.submit(command=["true"], name=f"b{i}", memory_gb=3.0,
                             workload="resnet_train128", env=None, cwd=None, at=ctl.now())
            for i in range(jobs)]
    base = len(ctl.store.events())
    lat: list[float] = []
    stop = threading.Event()

    def poll_status() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            ctl.status()
            lat.append(time.perf_counter() - t0)
            time.sleep(0.005)

    th = threading.Thread(target=poll_status, daemon=True)
    th.start()
    t0 = time.perf_counter()
    for r in recs:
        ctl.rt.post_event(JobSubmitted(JobSpec(r.id, r.name, r.memory_gb, r.workload)))
    deadline = time.time() + 300
    while time.time() < deadline and not settled(ctl, jobs):
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    evs = [e for e in ctl.store.events()[base:] if not e["kind"].startswith("decision:")
           and e["kind"][:1].isupper()]
    ctl.stop()
    lat.sort()
    share = {}
    if timed is not None:  # the observer's hooks vs the loop's whole handling of the events
        loop = handling_seconds(timed.obs)
        share = {"observer_ms_per_event": 1e3 * timed.spent / max(1, len(evs)),
                 "loop_ms_per_event": 1e3 * loop / max(1, len(evs)),
                 "observer_share_of_loop": timed.spent / loop if loop else 0.0}
    return {**share, "events": len(evs), "wall_s": wall, "events_per_s": len(evs) / wall,
            "status_p50_ms": 1e3 * lat[len(lat) // 2],
            "status_p99_ms": 1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            "status_calls": len(lat)}


def sim_run(observe: bool, root: Path, jobs: int = 1000, gpus: int = 40) -> dict[str, float]:
    from miso.sim.engine import Simulator
    from miso.sim.run import build_policy
    from miso.sim.traces import poisson_jobs
    from miso.sim.world import WorldConfig

    cfg = WorldConfig(gpu_model="A100-40GB", n_gpus=gpus)
    tj = poisson_jobs(jobs, seed=1, mean_interarrival_s=30.0)
    pol = build_policy("miso+", tj, cfg, 1)
    obs = None
    if observe:
        obs = Timed(Observer(Metrics(), DecisionLog(Path(tempfile.mkdtemp(dir=root)) /
                                                    "d.jsonl", flush=False),  # as simulate
                             estimates=policy_estimates(pol)))
    t0 = time.perf_counter()
    r = Simulator(pol, tj, cfg, seed=1, observer=obs).run()
    wall = time.perf_counter() - t0
    share = {"observer_share_of_run": obs.spent / wall,
             "observer_ms_per_decision": 1e3 * obs.spent / r.decisions} if obs else {}
    return {**share, "events": r.events, "decisions": r.decisions, "wall_s": wall,
            "events_per_s": r.events / wall}


def view_costs(root: Path, gpus: int, jobs: int) -> dict[str, float]:
    """GET /metrics and GET /api/v1/cluster latency on a settled cluster (observe on)."""
    from fastapi.testclient import TestClient

    d = Path(tempfile.mkdtemp(dir=root))
    cfg = ControllerConfig(policy=POLICY, estimator="true", poll_interval=0.05,
                           check_commands=False)
    ctl = Controller(JobStore(d / "miso.db"), InstantAgents(gpus), cfg,
                     checkpoint_root=d / "ckpt")
    obs = attach(ctl, d)
    ctl.start()
    for i in range(jobs):
        ctl.submit(["true"], name=f"v{i}", workload="resnet_train128")
    deadline = time.time() + 300
    while time.time() < deadline and not settled(ctl, jobs):
        time.sleep(0.01)
    client = TestClient(make_app(ctl, obs))
    out = {}
    for path in ("/metrics", "/api/v1/cluster", "/api/v1/events"):
        ts = []
        for _ in range(50):
            t0 = time.perf_counter()
            assert client.get(path).status_code == 200
            ts.append(time.perf_counter() - t0)
        ts.sort()
        out[path] = {"p50_ms": 1e3 * ts[25], "p99_ms": 1e3 * ts[49]}
    out["metrics_bytes"] = len(client.get("/metrics").content)
    ctl.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=448)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="miso-bench-observe-"))
    res: dict[str, Any] = {"live": {"on": [], "off": []}, "sim": {"on": [], "off": []}}
    for _ in range(a.repeats):
        for mode in ("off", "on"):
            res["live"][mode].append(one_run(mode == "on", a.gpus, a.jobs, root))
            res["sim"][mode].append(sim_run(mode == "on", root))
    summary: dict[str, Any] = {"gpus": a.gpus, "jobs": a.jobs, "repeats": a.repeats}
    for part in ("live", "sim"):
        for mode in ("off", "on"):
            runs = res[part][mode]
            summary[f"{part}_{mode}"] = {k: round(statistics.median(r[k] for r in runs), 4)
                                         for k in runs[0]}
    summary["views"] = view_costs(root, a.gpus, a.jobs)
    print(json.dumps(summary, indent=2))
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "runs": res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
