"""What keeping owners' usage in the store and saying why jobs wait under fair share cost the
live controller's event loop (issue 16, follow-up: durable usage, fair-share wait reasons).

A controller on a virtual clock with a file job store, driven by hand (no agents: a plan
executor that accepts every plan), policy nopart on 16 A100-40GB, fair share on; 4 owners
submit ``--jobs`` jobs (owner 0 half of them), then jobs end one at a time and the policy
places the next. Each variant handles the same events:

* ``full``: as shipped (the ledger written at every change of a charge, the fair-share waits
  recomputed at most every 0.5 s while events stream in, and when the loop goes idle);
* ``no-ledger``: without the writes; ``no-waits``: without the fair-share waits;
* ``neither``: without both (the loop before this change).

Prints the wall time per handled event of each variant (median of ``--repeat`` runs).

    python benchmarks/tenancy/usage_overhead.py [--jobs 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import miso.controller.loop as loop_mod
from miso.controller import Controller, ControllerConfig
from miso.controller.runtime import GpuRef
from miso.controller.store import JobStore
from miso.mig import geometry
from miso.sched import GpuAdded, JobFinished, make_policy
from miso.sched.clock import VirtualClock
from miso.sched.tenancyconfig import TenancyConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # shared helpers
from helpers import AcceptingPlans  # noqa: E402


def run(jobs: int, *, ledger: bool, waits: bool) -> tuple[float, int]:
    """Seconds spent handling events, and how many events."""
    real = loop_mod.fair_waits
    if not waits:
        loop_mod.fair_waits = lambda state: []  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as d:
            clock = VirtualClock()
            con = Controller(JobStore(Path(d) / "miso.db"), None,  # type: ignore[arg-type]
                             ControllerConfig(policy="nopart", tenancy=TenancyConfig(),
                                              check_commands=False),
                             checkpoint_root=Path(d) / "ck", clock=clock,
                             policy=make_policy("nopart"))
            con.loop.executor = AcceptingPlans()  # type: ignore[assignment]
            if not ledger:
                con.loop.on_ledger = None
            geom = geometry("A100-40GB")
            for i in range(16):
                con.rt.gpus[f"g{i}"] = GpuRef(f"g{i}", "n0", i, "A100-40GB", geom)
                con.loop.handle(("event", GpuAdded(f"g{i}", "A100-40GB")))
            ids = []
            for k in range(jobs):
                o = 0 if k % 2 == 0 else 1 + (k // 2) % 3
                ids.append(con.submit(["train"], memory_gb=4.0, owner=f"u:{o}",
                                      owner_name=f"user{o}"))
            n = 0
            t0 = time.perf_counter()
            while con.loop.run_once():
                n += 1
            st = con.loop.state
            while True:
                running = [j for gs in st.gpus.values() for j in gs.jobs]
                if not running:
                    break
                clock.advance(10.0)
                con.loop.handle(("event", JobFinished(running[0])))
                n += 1
            dt = time.perf_counter() - t0
            con.store.close()
            return dt, n
    finally:
        loop_mod.fair_waits = real


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"{a.jobs} jobs, 4 owners, 16 GPUs, nopart, fair share; median of {a.repeat}")
    print("| variant | events | ms per event |")
    print("|---|---|---|")
    for name, ledger, waits in (("full", True, True), ("no-ledger", False, True),
                                ("no-waits", True, False), ("neither", False, False)):
        times = []
        n = 0
        for _ in range(a.repeat):
            dt, n = run(a.jobs, ledger=ledger, waits=waits)
            times.append(dt / n * 1e3)
        print(f"| {name} | {n} | {statistics.median(times):.3f} |")


if __name__ == "__main__":
    main()
