"""The live controller at size: fake nodes (no job processes), the real controller, store,
API, poller and decision loop, loaded through the authenticated API by many client threads.

    python benchmarks/scale/live.py --gpus 64 --jobs 1000 --json FILE        # the CI size
    python benchmarks/scale/live.py --gpus 1024 --jobs 10000 --json FILE     # issue 32's size
    python benchmarks/scale/live.py --gpus 1024 --jobs 10000 --arrival-per-s 60 --json F  # at 60/s

The server process is what the cluster head runs (:func:`miso.api.head.serve` over a
:class:`~miso.controller.Controller` with its observer), over ``--gpus / 8`` fake nodes of 8
A100s (:mod:`miso.agent.fakeagent`: the agent protocol, leases and fencing; jobs are timers
that progress as :mod:`miso.emuworkload` would). The clients (threads of this process, one
user, token and keep-alive connection each, one user per tenant) submit the jobs of the
config's mix (the MISO trace's workloads and durations, :func:`miso.sim.traces.poisson_jobs`,
durations times ``duration_scale``) at ``arrival_per_s`` (0: as fast as answers come), while
other threads read ``/status?summary=true`` (what ``miso status`` shows first), a status page
of ``status_limit`` jobs, and ``/metrics``.

After the submissions the run holds ``hold_s`` seconds, then (``replan_gpus`` > 0) takes that
many GPUs' nodes away, lets their leases run out, brings them back, and times until every
returned GPU runs a job again (the full re-plan). At the end every accepted id must be in the
store exactly once (``lost`` counts those that are not, or that failed), and no job may have
two live attempts at once or finish twice (``twice``).

Recorded: submit latency and rate; event-to-decision latency (queue wait + the driver step of
each event); time per policy ``decide`` call; plan execution time per GPU (by decision kind);
status and metrics latency; the server process's CPU and RSS (it holds the controller, the API
and the fake agents); the store's size; the 1-minute load average at start and end.
``--ranges`` checks the figures against benchmarks/scale/ranges.json (``<gpus>x<jobs>``): a
figure out of bounds fails the run (exit 1). ``--sim`` also runs the simulator on the same
config and puts its decisions per second and time per ``decide`` call beside the live ones.
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import json
import os
import pstats
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "config.json"
RANGES = HERE / "ranges.json"
MAX_JOBS, MAX_GPUS = 20_000, 2048


# ---- shared -------------------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def dist(xs: list[float], nd: int = 4) -> dict[str, Any]:
    """n, p50, p99, max of ``xs`` (seconds)."""
    return {"n": len(xs), **{k: None if v is None else round(v, nd) for k, v in (
        ("p50", pct(xs, 0.5)), ("p99", pct(xs, 0.99)), ("max", max(xs) if xs else None))}}


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds (user + system, all threads) and RSS / peak RSS (MiB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out = {"cpu_s": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out["rss_mib" if k == "VmRSS" else "peak_rss_mib"] = round(int(v.split()[0]) / 1024, 1)
    return out


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads, summed by kind (the thread's name up to
    its first ``-`` after ``miso-``: ``miso-loop``, ``miso-poll``, ``miso-gpu``, ``miso-api``;
    AnyIO's worker threads, which run the API's routes, are ``AnyIO``): where the server's
    CPU goes, per role, without a profiler's own cost. Threads that ended are not counted."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            f = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task.name), "other")
        parts = name.split("-")
        kind = "-".join(parts[:2]) if parts[0] == "miso" else parts[0].split(" ")[0]
        out[kind] = out.get(kind, 0.0) + (int(f[11]) + int(f[12])) / tick
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def job_mix(cfg: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The jobs of a run: workload, work (s on a full GPU), owner (tenant), submit offset."""
    from miso.sim.traces import poisson_jobs

    rate = float(cfg["arrival_per_s"])
    tj = poisson_jobs(n, seed=int(cfg["seed"]), mean_interarrival_s=1.0 / rate if rate else 1.0,
                      duration_scale=float(cfg["duration_scale"]))
    return [{"workload": j.workload, "work_s": max(1.0, j.duration_s),
             "owner": f"t{i % int(cfg['tenants']):02d}",
             "at": j.submit_s if rate else 0.0} for i, j in enumerate(tj)]


def offered_rate(jobs: list[dict[str, Any]]) -> float | None:
    """Submissions per second the schedule offers (jobs over the span of their submit
    offsets), beside the rate the server took them at; None when all are offered at once
    (``arrival_per_s`` 0: the clients submit as fast as answers come)."""
    span = max((j["at"] for j in jobs), default=0.0)
    return round(len(jobs) / span, 1) if span > 0 else None


def command(job: dict[str, Any], ips: float) -> list[str]:
    return [sys.executable, "-m", "miso.emuworkload", "--workload", job["workload"],
            "--iterations", str(max(1, int(job["work_s"] * ips))), "--ips", str(ips)]


# ---- the server process -------------------------------------------------------------------------


class Recorder:
    """What the server measures inside the controller (wrapping its public seams)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decide_s: list[float] = []
        self.decisions = 0
        self.decide_total_s = 0.0
        self.e2d_s: list[float] = []
        self.e2d_after_s: list[float] = []
        self.marked = False
        self.exec_s: dict[str, list[float]] = {}
        self.twice: list[str] = []
        self._lag: float | None = None
        self.gc: GcPauses | None = None

    def wrap_decide(self, policy: Any) -> None:
        inner = policy.decide

        def decide(now: float, ev: Any, state: Any) -> Any:
            t0 = time.perf_counter()
            out = inner(now, ev, state)
            dt = time.perf_counter() - t0
            self.decide_s.append(dt)
            self.decide_total_s += dt
            self.decisions += len(out)
            return out
        policy.decide = decide

    def on_timing(self, name: str, seconds: float) -> None:
        """The loop reports each event's queue wait (``loop_lag``), then its handling."""
        if name == "loop_lag":
            self._lag = seconds
        elif name == "event_handling" and self._lag is not None:
            self.e2d_s.append(self._lag + seconds)
            if self.marked:
                self.e2d_after_s.append(self._lag + seconds)
            self._lag = None

    def wrap_executor(self, ex: Any) -> None:
        inner = ex.execute_on_gpu

        def execute_on_gpu(gpu: str, d: Any, worker: Any) -> None:
            t0 = time.perf_counter()
            try:
                inner(gpu, d, worker)
            finally:
                with self.lock:
                    self.exec_s.setdefault(type(d).__name__, []).append(
                        time.perf_counter() - t0)
        ex.execute_on_gpu = execute_on_gpu

    def wrap_agent(self, agent: Any, live: dict[str, Any]) -> None:
        """A job launched while an earlier attempt of it still runs on any node is run
        twice."""
        inner = agent.launch

        def launch(spec: dict[str, Any]) -> dict[str, Any]:
            job = str(spec["job"])
            with self.lock:
                prev = live.get(job)
                if prev is not None and prev[1].running and prev[0] != int(spec["attempt"]):
                    self.twice.append(job)
            out = inner(spec)
            if out["ok"]:
                a = agent.attempts.get((job, int(spec["attempt"])))
                if a is not None:
                    with self.lock:
                        live[job] = (a.attempt, a)
            return out
        agent.launch = launch


class GcPauses:
    """The garbage collector's pauses in this process, by generation (``gc.callbacks``): a
    full collection stops every thread, the scheduling loop with them."""

    def __init__(self) -> None:
        self.by_gen: dict[int, list[float]] = {}
        self._t0 = 0.0
        import gc
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.by_gen.setdefault(int(info["generation"]), []).append(
                time.perf_counter() - self._t0)

    def report(self) -> dict[str, Any]:
        return {str(g): {"n": len(v), "total_s": round(sum(v), 2), "max_s": round(max(v), 3)}
                for g, v in sorted(self.by_gen.items())}


#: Innermost frames of a thread that waits (a lock, a queue, a socket, a timer).
IDLE_FILES = {"threading.py", "queue.py", "selectors.py", "base_events.py"}
IDLE_CALLS = {"wait", "sleep", "select", "_worker", "run_forever"}


class Sampler:
    """A sampling profiler of every thread of this process (``sys._current_frames`` every
    ``every`` s): per thread kind (the names :func:`thread_cpu` groups), how many samples
    found it running, and in how many each function was on its stack (inclusive) or
    innermost (self). Where py-spy is not installed, it says where the server's CPU goes."""

    def __init__(self, every: float = 0.02) -> None:
        self.every = every
        self.running: dict[str, int] = {}
        self.incl: dict[tuple[str, str], int] = {}
        self.own: dict[tuple[str, str], int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self.stop.wait(self.every):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():  # noqa: SLF001
                top = frame.f_code
                if ident == me or Path(top.co_filename).name in IDLE_FILES \
                        or top.co_name in IDLE_CALLS:
                    continue  # waiting, not running
                parts = names.get(ident, "?").split("-")
                kind = "-".join(parts[:2]) if parts[0] == "miso" else parts[0].split(" ")[0]
                self.running[kind] = self.running.get(kind, 0) + 1
                seen: set[str] = set()
                f: Any = frame
                while f is not None:
                    code = f.f_code
                    where = f"{Path(code.co_filename).name}:{code.co_name}"
                    if f is frame:
                        self.own[(kind, where)] = self.own.get((kind, where), 0) + 1
                    if where not in seen:
                        seen.add(where)
                        self.incl[(kind, where)] = self.incl.get((kind, where), 0) + 1
                    f = f.f_back

    def report(self, n: int = 30) -> str:
        """Per thread kind (most samples first): its samples, then its functions by
        inclusive count (with their self count)."""
        out = []
        for kind, total in sorted(self.running.items(), key=lambda kv: -kv[1]):
            out.append(f"== {kind}: {total} samples running")
            rows = sorted(((c, w) for (k, w), c in self.incl.items() if k == kind),
                          reverse=True)[:n]
            out.extend(f"{c:7d} {100 * c / total:5.1f}% self {self.own.get((kind, w), 0):6d}"
                       f"  {w}" for c, w in rows)
        return "\n".join(out) + "\n"


class LoopProfile:
    """A profiler enabled in the loop thread from its next turn on, and disabled there when
    asked (cProfile sees only the thread that enables it)."""

    def __init__(self, loop: Any) -> None:
        self.prof = cProfile.Profile()
        self.on = False
        self.stop = threading.Event()
        self.done = threading.Event()
        inner = loop.run_once

        def run_once(timeout: float = 0.0) -> bool:
            if self.stop.is_set():
                if self.on:
                    self.prof.disable()
                    self.on = False
                self.done.set()
            elif not self.on and not self.done.is_set():
                self.on = True
                self.prof.enable()
            return inner(timeout)
        loop.run_once = run_once

    def write(self, path: str) -> None:
        """Stop profiling (at the loop's next turn) and write its top functions."""
        self.stop.set()
        self.done.wait(5.0)
        with open(path, "w") as f:
            pstats.Stats(self.prof, stream=f).sort_stats("cumulative").print_stats(70)


def serve_main(state: Path, cfg: dict[str, Any], gpus: int) -> int:
    import logging

    from miso.api.head import serve, users_of
    from miso.cluster.local import LocalCluster
    from miso.controller import Controller, ControllerConfig
    from miso.controller.storefile import open_store
    from miso.observe import attach
    from miso.observe.routes import api_routers, instrument

    logging.basicConfig(level=logging.WARNING)
    if os.environ.get("MISO_SCALE_SWITCH"):  # the interpreter's switch interval (A/B runs)
        sys.setswitchinterval(float(os.environ["MISO_SCALE_SWITCH"]))
    per = int(cfg["gpus_per_node"])
    ccfg = ControllerConfig(**{"policy": cfg["policy"], **cfg["controller"]})
    lc = LocalCluster(state, nodes=gpus // per, gpus_per_node=per, config=ccfg, fake=True,
                      start=False)
    rec = Recorder()
    if os.environ.get("MISO_SCALE_GC"):  # opt-in: a hook on every collection (A/B runs)
        rec.gc = GcPauses()
    live: dict[str, Any] = {}
    for ag in lc.transport.agents().values():
        rec.wrap_agent(ag, live)
    store = open_store(state)
    ctl = Controller(store, lc.transport, ccfg, checkpoint_root=state / "checkpoints")
    obs = attach(ctl, state)
    inner_timing = obs.on_timing

    def on_timing(name: str, seconds: float) -> None:
        rec.on_timing(name, seconds)
        inner_timing(name, seconds)
    obs.on_timing = on_timing  # type: ignore[method-assign]
    rec.wrap_decide(ctl.policy)
    rec.wrap_executor(ctl.executor)
    ctl.start()
    lc.controller = ctl
    users = users_of(state)
    tokens = {"admin": users.add("admin", admin=True)}
    for i in range(int(cfg["tenants"])):
        tokens[f"t{i:02d}"] = users.add(f"t{i:02d}")
    users.close()
    srv = serve(ctl, state, {"host": "127.0.0.1", "port": 0},
                extra_routers=api_routers(ctl, obs), setup=lambda app: instrument(app, obs))
    fd = os.open(state / "bench.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": srv.url, "tokens": tokens, "pid": os.getpid()}, f)

    def answer(name: str, data: dict[str, Any]) -> None:
        tmp = state / f".{name}.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(state / name)

    prof = LoopProfile(ctl.loop) if os.environ.get("MISO_SCALE_PROFILE_LOOP") else None
    sampler = Sampler() if os.environ.get("MISO_SCALE_SAMPLE") else None
    if sampler is not None:
        sampler.thread.start()
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "replan":
            answer("replan.json", replan(lc, ctl, int(cmd[1]), per))
        elif cmd[0] == "mark":  # measurements from now on (after the submissions)
            rec.marked = True
        elif cmd[0] == "finish":
            answer("server.json", finish(lc, ctl, rec, state))
            if prof is not None:  # the loop thread's own profile (cProfile, wall time)
                prof.write(os.environ["MISO_SCALE_PROFILE_LOOP"])
            if sampler is not None:
                sampler.stop.set()
                Path(os.environ["MISO_SCALE_SAMPLE"]).write_text(sampler.report(60))
            break
    srv.stop()
    lc.close()
    return 0


def replan(lc: Any, ctl: Any, gpus: int, per: int) -> dict[str, Any]:
    """Take ``gpus`` GPUs' nodes away (their jobs die), wait for the controller to requeue
    their jobs, bring the nodes back, and time until every returned GPU runs a job, or,
    when no job is left to place (the controller's queue empty: a short run's jobs ended),
    until they all joined (``ended_by`` says which: a GPU cannot run a job nobody waits
    for, and miso+ moves no running job to an idle GPU)."""
    nodes = sorted(lc.transport.agents())[: max(1, gpus // per)]
    for n in nodes:
        lc.transport.remove(n)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        gone = {g["id"].split("/")[0] for g in ctl.cluster()["gpus"]}
        if not gone & set(nodes):
            break
        time.sleep(0.1)
    lost_s = time.monotonic() - t0
    for n in nodes:
        agent = lc.add_node(n, per)
        del agent  # the harness's twice check covers launches on the original agents only
    t1 = time.monotonic()
    want = {f"{n}/{i}" for n in nodes for i in range(per)}
    seen_at: float | None = None
    ended_by = None
    while time.monotonic() - t1 < 60:
        snap = ctl.cluster()
        placed = {g["id"] for g in snap["gpus"] if g["id"] in want and g["jobs"]}
        joined = {g["id"] for g in snap["gpus"] if g["id"] in want}
        if seen_at is None and joined == want:
            seen_at = time.monotonic() - t1
        if placed == want:
            running = {r.gpu for r in list(ctl.rt.runs.values())}
            if want <= running:
                ended_by = "all_run"
                break
        elif joined == want and not snap["queue"]:
            ended_by = "queue_empty"
            break
        time.sleep(0.05)
    return {"gpus": len(want), "lost_after_s": round(lost_s, 2),
            "joined_s": None if seen_at is None else round(seen_at, 2),
            "replan_s": round(time.monotonic() - t1, 2),
            "complete": ended_by is not None, "ended_by": ended_by,
            "returned_running": len(placed & {r.gpu for r in list(ctl.rt.runs.values())})}


def finish(lc: Any, ctl: Any, rec: Recorder, state: Path) -> dict[str, Any]:
    st = proc_stats(os.getpid())
    jobs = ctl.store.jobs()
    finished: dict[str, int] = {}
    for a in ctl.store.attempts():
        if a["status"] == "finished":
            finished[a["job"]] = finished.get(a["job"], 0) + 1
    size = sum(p.stat().st_size for p in state.glob("miso.db*") if p.name != "miso.db.bak")
    with rec.lock:
        execs = {k: dist(v) for k, v in rec.exec_s.items()}
    return {
        "ids": [j.id for j in jobs], "failed": [j.id for j in jobs if j.state == "failed"],
        "states": ctl.store.counts(),
        "twice": sorted(set(rec.twice) | {j for j, n in finished.items() if n > 1}),
        "decide_s": dist(rec.decide_s, 5), "decisions": rec.decisions,
        "decide_calls": len(rec.decide_s), "e2d_s": dist(rec.e2d_s),
        "e2d_after_submit_s": dist(rec.e2d_after_s),
        "decisions_per_decide_s": round(rec.decisions / max(rec.decide_total_s, 1e-9), 1),
        "exec_s": execs, "store_mib": round(size / 2**20, 2), "errors": ctl.errors[-5:],
        "cpu_by_thread_s": thread_cpu(), **st,
        "gc_pauses": rec.gc.report() if rec.gc is not None else None,
    }


# ---- the clients --------------------------------------------------------------------------------


class Clients:
    """Submitters and readers, one keep-alive connection per thread (the standard library's
    http.client: the lightest client, leaving the CPU to the server)."""

    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        self.host = urlsplit(url)
        self.tokens = tokens
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = {"submit": [], "summary": [], "status": [],
                                            "metrics": []}
        self.errors: list[str] = []
        self.ids: list[str] = []

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host.hostname, self.host.port, timeout=60)

    def request(self, c: http.client.HTTPConnection, op: str, user: str, method: str,
                path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        hdr = {"Authorization": f"Bearer {self.tokens[user]}",
               "Content-Type": "application/json"}
        t0 = time.perf_counter()
        c.request(method, path, body=None if body is None else json.dumps(body).encode(),
                  headers=hdr)
        r = c.getresponse()
        data = r.read()
        dt = time.perf_counter() - t0
        with self.lock:
            self.lat[op].append(dt)
            if r.status >= 300:
                self.errors.append(f"{op}: {r.status} {data[:120]!r}")
        return r.status, data

    def submitters(self, jobs: list[dict[str, Any]], threads: int, ips: float,
                   t_start: float) -> list[threading.Thread]:
        work: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        for i, j in enumerate(jobs):
            work.put((i, j))

        def run() -> None:
            c = self.conn()
            while True:
                try:
                    i, j = work.get_nowait()
                except queue.Empty:
                    break
                wait = t_start + j["at"] - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                body = {"command": command(j, ips), "name": f"s{i}",
                        "request_id": f"req-{i:08d}"}
                for _ in range(3):  # a retry with the same request id is safe
                    try:
                        code, data = self.request(c, "submit", j["owner"], "POST",
                                                  "/api/v1/jobs", body)
                        if code == 201:
                            with self.lock:
                                self.ids.append(json.loads(data)["id"])
                        break
                    except (OSError, http.client.HTTPException) as e:
                        with self.lock:
                            self.errors.append(f"submit: {type(e).__name__}: {e}")
                        c.close()
                        c = self.conn()
            c.close()
        return [threading.Thread(target=run, daemon=True) for _ in range(threads)]

    def reader(self, op: str, path: str, every: float, stop: threading.Event,
               user: str = "admin") -> threading.Thread:
        def run() -> None:
            c = self.conn()
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    self.request(c, op, user, "GET", path)
                except (OSError, http.client.HTTPException) as e:
                    with self.lock:
                        self.errors.append(f"{op}: {type(e).__name__}: {e}")
                    c.close()
                    c = self.conn()
                stop.wait(max(0.0, every - (time.monotonic() - t0)))
            c.close()
        return threading.Thread(target=run, daemon=True)


# ---- the run ------------------------------------------------------------------------------------


def _terminated(*_: Any) -> None:
    raise SystemExit("terminated")  # so that the server process is ended too (finally)


def run(gpus: int, n: int, cfg: dict[str, Any], keep: bool = False) -> dict[str, Any]:
    import signal

    signal.signal(signal.SIGTERM, _terminated)
    state = Path(tempfile.mkdtemp(prefix="miso-scale-"))
    load0 = loadavg()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(state), "--gpus",
                             str(gpus), "--config-json", json.dumps(cfg)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=open(state / "server.log", "w"),  # noqa: SIM115
                            text=True, start_new_session=True)
    assert proc.stdin is not None
    try:
        deadline = time.time() + 120
        while not (state / "bench.json").exists():
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit("server did not start: "
                                 + (state / "server.log").read_text()[-800:])
            time.sleep(0.1)
        info = json.loads((state / "bench.json").read_text())
        assert info["url"].startswith("http://127.0.0.1:"), info["url"]  # loopback only
        pid = info["pid"]
        cl = Clients(info["url"], info["tokens"])
        jobs = job_mix(cfg, n)
        stop = threading.Event()
        readers = [cl.reader("summary", "/api/v1/status?summary=true", cfg["status_every_s"],
                             stop),
                   cl.reader("status", f"/api/v1/status?limit={cfg['status_limit']}",
                             cfg["status_every_s"] * 2, stop, "t00"),
                   cl.reader("metrics", "/metrics", cfg["metrics_every_s"], stop)]
        for t in readers:
            t.start()
        cpu0 = proc_stats(pid)["cpu_s"]
        t0 = time.monotonic()
        subs = cl.submitters(jobs, int(cfg["submitters"]), float(cfg["ips"]), t0)
        for t in subs:
            t.start()
        for t in subs:
            t.join()
        submit_wall = time.monotonic() - t0
        load_submit = loadavg()
        proc.stdin.write("mark\n")
        proc.stdin.flush()
        time.sleep(float(cfg["hold_s"]))
        load_hold = loadavg()
        rp: dict[str, Any] | None = None
        k = min(int(cfg["replan_gpus"]), gpus // 4)
        if k:
            proc.stdin.write(f"replan {k}\n")
            proc.stdin.flush()
            while not (state / "replan.json").exists() and proc.poll() is None:
                time.sleep(0.2)
            rp = json.loads((state / "replan.json").read_text())
            rp["loadavg"] = loadavg()
        stop.set()
        for t in readers:
            t.join(timeout=70)
        cpu = proc_stats(pid)["cpu_s"] - cpu0
        wall = time.monotonic() - t0
        proc.stdin.write("finish\n")
        proc.stdin.flush()
        while not (state / "server.json").exists() and proc.poll() is None:
            time.sleep(0.2)
        srv = json.loads((state / "server.json").read_text())
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if not keep:
            import shutil
            shutil.rmtree(state, ignore_errors=True)
    stored = set(srv.pop("ids"))
    lost = len(set(cl.ids) - stored) + len(srv.pop("failed"))
    twice = srv.pop("twice")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpus": gpus, "jobs": n,
        "nodes": gpus // int(cfg["gpus_per_node"]), "policy": cfg["policy"],
        "submitted": len(cl.ids), "submit_wall_s": round(submit_wall, 1),
        "submits_per_s": round(len(cl.ids) / submit_wall, 1),
        "offered_per_s": offered_rate(jobs),
        "submit_s": dist(cl.lat["submit"]),
        "decision_p99_s": srv["e2d_s"]["p99"], "event_to_decision_s": srv["e2d_s"],
        "event_to_decision_after_submit_s": srv["e2d_after_submit_s"],
        "decisions_per_s": round(srv["decisions"] / wall, 1),
        "decisions_per_decide_s": srv["decisions_per_decide_s"],
        "decide_call_s": srv["decide_s"], "decide_calls": srv["decide_calls"],
        "decisions": srv["decisions"], "plan_exec_s": srv["exec_s"],
        "status_p99_s": pct(cl.lat["summary"], 0.99) and round(pct(cl.lat["summary"], 0.99)
                                                             or 0.0, 4),
        "status_summary_s": dist(cl.lat["summary"]),
        "status_page_s": dist(cl.lat["status"]), "metrics_s": dist(cl.lat["metrics"]),
        "replan": rp, "replan_s": rp["replan_s"] if rp else None,
        "server_cpu_s": round(cpu, 1), "server_cpu_frac": round(cpu / wall, 2),
        "server_cpu_by_thread_s": srv["cpu_by_thread_s"],
        "rss_mib": srv["rss_mib"], "peak_rss_mib": srv["peak_rss_mib"],
        "gc_pauses": srv.get("gc_pauses"),
        "store_mib": srv["store_mib"], "states": srv["states"],
        "lost": lost, "twice": len(twice), "twice_jobs": twice[:10],
        "errors": len(cl.errors), "error_examples": cl.errors[:5],
        "controller_errors": srv["errors"],
        "loadavg": {"start": load0, "after_submit": load_submit, "after_hold": load_hold,
                    "end": loadavg()},
        "config": cfg,
    }


def simulate(gpus: int, n: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """The simulator on the same cluster, jobs and arrivals: decisions per second of wall
    time and time per ``decide`` call, as the live harness measures them."""
    from miso.sim.engine import Simulator
    from miso.sim.run import build_policy
    from miso.sim.traces import TraceJob
    from miso.sim.world import WorldConfig

    jobs = job_mix(cfg, n)
    tj = [TraceJob(f"j{i}", j["at"], j["work_s"], j["workload"], owner=j["owner"])
          for i, j in enumerate(jobs)]
    wc = WorldConfig(n_gpus=gpus, profile_s_per_level=float(
        cfg["controller"].get("profile_seconds_per_level", 10.0)))
    pol = build_policy(cfg["policy"], tj, wc, int(cfg["seed"]))
    rec = Recorder()
    rec.wrap_decide(pol)
    t0 = time.perf_counter()
    Simulator(pol, tj, wc, seed=int(cfg["seed"])).run()
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 2), "decide_calls": len(rec.decide_s),
            "decisions": rec.decisions, "decisions_per_s": round(rec.decisions / wall, 1),
            "decisions_per_decide_s": round(rec.decisions / max(rec.decide_total_s, 1e-9), 1),
            "decide_call_s": dist(rec.decide_s, 5), "loadavg": loadavg()}


def check(res: dict[str, Any], ranges: dict[str, Any]) -> list[str]:
    """The figures outside their bounds (``{"key": [low, high]}``, a dotted key reads into
    nested results; null: no bound)."""
    bad = []
    for key, (lo, hi) in ranges.items():
        v: Any = res
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is None:
            bad.append(f"{key}: missing")
        elif (lo is not None and v < lo) or (hi is not None and v > hi):
            bad.append(f"{key} = {v} outside [{lo}, {hi}]")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=64, help="GPUs (8 per fake node)")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--config", default=str(CONFIG), help="the run's knobs (JSON)")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--ranges", default=str(RANGES),
                    help="bounds per size (JSON); 'none' to check nothing")
    ap.add_argument("--duration-scale", type=float,
                    help="the config's duration_scale (jobs' work: the MISO trace's times this; "
                    "1.0 keeps every job running through the run, so the queue stays deep)")
    ap.add_argument("--arrival-per-s", type=float, metavar="R",
                    help="the config's arrival_per_s: open-loop Poisson submissions at R/s, "
                    "whatever the answers' speed (as clusterloader2 drives a fixed QPS); 0: as "
                    "fast as answers come")
    ap.add_argument("--sim", action="store_true", help="also run the simulator on the config")
    ap.add_argument("--keep", action="store_true", help="keep the state directory")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--config-json", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        return serve_main(Path(a.serve), json.loads(a.config_json), a.gpus)
    cfg = json.loads(Path(a.config).read_text())
    if a.duration_scale is not None:
        cfg["duration_scale"] = a.duration_scale
    if a.arrival_per_s is not None:
        if not 0 <= a.arrival_per_s <= 10_000:
            ap.error("need 0 <= --arrival-per-s <= 10000")
        cfg["arrival_per_s"] = a.arrival_per_s
    if not (8 <= a.gpus <= MAX_GPUS and a.gpus % int(cfg["gpus_per_node"]) == 0
            and 1 <= a.jobs <= MAX_JOBS):
        ap.error(f"need 8 <= --gpus <= {MAX_GPUS} (a multiple of {cfg['gpus_per_node']}) "
                 f"and 1 <= --jobs <= {MAX_JOBS}")
    res = run(a.gpus, a.jobs, cfg, a.keep)
    if a.sim:
        res["sim"] = simulate(a.gpus, a.jobs, cfg)
    bad: list[str] = []
    if a.ranges != "none":
        size = f"{a.gpus}x{a.jobs}"
        spec = json.loads(Path(a.ranges).read_text())
        if size in spec and isinstance(spec[size], dict):
            bad = check(res, spec[size])
            res["ranges"] = {"size": size, "out_of_bounds": bad}
    text = json.dumps(res, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    if bad:
        print("OUT OF BOUNDS: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
