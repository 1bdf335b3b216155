"""Where the scheduling loop's time goes at size, without the API: the controller, store,
poller and decision loop over ``--gpus / 8`` fake nodes in this process, jobs submitted
straight to :meth:`Controller.submit` from one thread for ``--seconds``, then: jobs accepted,
the loop's queue left behind (by item kind), event-to-decision latency, and the policy's
``decide`` time by event type (wall time, as the loop sees it).

    python benchmarks/scale/loopload.py --gpus 1024 --jobs 3000 --seconds 40

A diagnostic beside ``live.py`` (which measures through the authenticated API and checks
ranges): it says whether the loop is bound by the policy's decisions or by waits elsewhere.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import live  # noqa: E402  (benchmarks/scale/live.py: the job mix and the recorder)


def main(argv: list[str] | None = None) -> int:
    from miso.cluster.local import LocalCluster
    from miso.controller import Controller, ControllerConfig
    from miso.controller.storefile import open_store
    from miso.observe import attach

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=40.0, help="how long to submit and run")
    ap.add_argument("--config", default=str(live.CONFIG))
    ap.add_argument("--arrival-per-s", type=float, metavar="R",
                    help="submit at R/s (Poisson, open loop) instead of as fast as accepted")
    ap.add_argument("--profile", metavar="FILE",
                    help="cProfile the loop thread; its top functions (cumulative) go here")
    ap.add_argument("--sample", metavar="FILE",
                    help="sample every thread's stack (live.Sampler); per thread kind, "
                         "its functions by samples go here")
    a = ap.parse_args(argv)
    if not (8 <= a.gpus <= live.MAX_GPUS and a.gpus % 8 == 0 and 1 <= a.jobs <= live.MAX_JOBS
            and 1 <= a.seconds <= 300):
        ap.error("need 8 <= --gpus <= 2048 (a multiple of 8), 1 <= --jobs <= 20000, "
                 "1 <= --seconds <= 300")
    cfg = json.loads(Path(a.config).read_text())
    if a.arrival_per_s is not None:
        cfg["arrival_per_s"] = max(0.0, a.arrival_per_s)
    state = Path(tempfile.mkdtemp(prefix="miso-loopload-"))
    ccfg = ControllerConfig(**{"policy": cfg["policy"], **cfg["controller"]})
    per = int(cfg["gpus_per_node"])
    lc = LocalCluster(state, nodes=a.gpus // per, gpus_per_node=per, config=ccfg, fake=True,
                      start=False)
    ctl = Controller(open_store(state), lc.transport, ccfg, checkpoint_root=state / "ckpt")
    obs = attach(ctl, state)
    rec = live.Recorder()
    inner = obs.on_timing

    def on_timing(name: str, seconds: float) -> None:
        rec.on_timing(name, seconds)
        inner(name, seconds)
    obs.on_timing = on_timing  # type: ignore[method-assign]
    by_type: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    decide = ctl.policy.decide

    def timed(now: float, ev: Any, st: Any) -> Any:
        t0 = time.perf_counter()
        out = decide(now, ev, st)
        by_type[type(ev).__name__] += time.perf_counter() - t0
        calls[type(ev).__name__] += 1
        return out
    ctl.policy.decide = timed  # type: ignore[method-assign]
    prof = live.LoopProfile(ctl.loop) if a.profile else None
    sampler = live.Sampler() if a.sample else None
    if sampler is not None:
        sampler.thread.start()
    ctl.start()
    lc.controller = ctl
    jobs = live.job_mix(cfg, a.jobs)
    t0 = time.monotonic()
    accepted: list[float] = []

    def submit() -> None:
        for i, j in enumerate(jobs):
            wait = t0 + j["at"] - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if time.monotonic() - t0 > a.seconds:
                return
            s = time.monotonic()
            ctl.submit(live.command(j, float(cfg["ips"])), name=f"s{i}", owner=j["owner"],
                       owner_name=j["owner"])
            accepted.append(time.monotonic() - s)

    cpu0 = os.times()
    th = threading.Thread(target=submit, daemon=True)
    th.start()
    while time.monotonic() - t0 < a.seconds:
        time.sleep(0.5)
    th.join()
    cpu1 = os.times()
    left = collections.Counter(it[0] if it[0] != "event" else type(it[1]).__name__
                               for it in list(ctl.rt.queue.queue))
    out = {
        "gpus": a.gpus, "seconds": a.seconds, "submitted": len(accepted),
        "submit_s": live.dist(accepted), "loop_queue_left": dict(left.most_common()),
        "event_to_decision_s": live.dist(rec.e2d_s),
        "decide_s_by_event": {k: {"calls": calls[k], "total_s": round(v, 2)}
                              for k, v in by_type.most_common()},
        "cpu_s": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 1),
        "cpu_by_thread_s": live.thread_cpu(),
        "states": ctl.store.counts(), "loadavg": live.loadavg()}
    print(json.dumps(out, indent=1))
    if prof is not None:
        prof.write(a.profile)
    if sampler is not None:
        sampler.stop.set()
        Path(a.sample).write_text(sampler.report(60))
    os._exit(0)  # the fake nodes' threads are daemons; no orderly stop needed for a figure


if __name__ == "__main__":
    sys.exit(main())
