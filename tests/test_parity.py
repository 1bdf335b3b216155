"""Sim/live parity: the same event stream through the simulator and through the live
controller's event loop, on a virtual clock, gives the same decision log, for every policy.

The simulator runs a trace (with outside events injected: failures, cancellations, a lost node)
and records every event it delivers. The stream is then replayed into a real
:class:`~miso.controller.Controller` (in-memory job store, :class:`VirtualClock`, no agents, a
plan executor that only records): submissions through the store, cancellations as the API's
cancel, the lost node as the poller reports it, acknowledgements as the poller and executor
post them, progress as ``JobProgress`` events (the live conversion from iterations is tested in
test_sched_core.py). Timers are *not* replayed: the live loop must raise its own ``Tick`` from
its clock when the replay reaches the time the simulator raised it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from helpers import AcceptingExecutor, DecisionRecorder

from miso.controller import Controller, ControllerConfig
from miso.controller.runtime import GpuRef
from miso.controller.store import JobStore
from miso.mig import Placement, geometry
from miso.sched import (
    Decision,
    GpuAdded,
    GpuRemoved,
    JobFailed,
    JobSubmitted,
    Tick,
)
from miso.sched.clock import VirtualClock
from miso.sched.decisions import RequeueJob
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.engine import Simulator
from miso.sim.run import build_policy
from miso.sim.traces import TraceJob, assign_tenants, mark_priority, poisson_jobs
from miso.sim.world import WorldConfig

POLICIES = ["nopart", "optsta", "mps", "oracle", "miso", "miso+"]
OPTSTA_LAYOUT = (Placement(0, "4g.20gb"), Placement(4, "2g.10gb"), Placement(6, "1g.5gb"))
NODE_OF = {f"gpu{i}": f"n{i // 2}" for i in range(8)}   # two GPUs per node


def _trace(n: int, seed: int) -> list[TraceJob]:
    """Poisson jobs whose ids are the ids the live store gives them (j0001, ... in order)."""
    jobs = sorted(poisson_jobs(n, seed=seed, mean_interarrival_s=25.0),
                  key=lambda j: (j.submit_s, int(j.id)))
    return [TraceJob(f"j{i + 1:04d}", j.submit_s, j.duration_s, j.workload)
            for i, j in enumerate(jobs)]


def _policy(name: str, jobs: list[TraceJob], cfg: WorldConfig) -> Any:
    kw: dict[str, Any] = {"layout": OPTSTA_LAYOUT} if name == "optsta" else {}
    return build_policy(name, jobs, cfg, 3, **kw)


def _simulate(name: str, jobs: list[TraceJob], cfg: WorldConfig,
              inject: list[tuple[float, Any]], tenancy: TenancyConfig | None = None
              ) -> list[tuple[float, object]]:
    sim = Simulator(_policy(name, jobs, cfg), jobs, cfg, seed=3, record=True, tenancy=tenancy)
    for at, ev in inject:
        sim.inject(at, ev)
    return sim.run().log


def _replay(name: str, jobs: list[TraceJob], cfg: WorldConfig,
            log: list[tuple[float, object]], tenancy: TenancyConfig | None = None
            ) -> list[tuple[float, Decision]]:
    clock = VirtualClock()
    store = JobStore(":memory:")
    con = Controller(store, None, ControllerConfig(policy=name, tenancy=tenancy),  # type: ignore[arg-type]
                     checkpoint_root="/nonexistent", clock=clock,
                     policy=_policy(name, jobs, cfg))
    rec = DecisionRecorder()
    con.observer = rec
    ex = AcceptingExecutor()
    con.loop.executor = ex  # type: ignore[assignment]
    loop, rt = con.loop, con.rt
    lost: set[str] = set()
    geom = geometry(cfg.gpu_model)
    for t, item in log:
        if isinstance(item, Decision):
            continue
        clock.advance_to(t)
        if isinstance(item, Tick):
            assert loop.run_due(), f"the live loop raised no timer at {t} ({item})"
            continue
        if isinstance(item, GpuAdded):
            rt.gpus[item.gpu] = GpuRef(item.gpu, NODE_OF[item.gpu], 0, item.model, geom)
            loop.handle(("event", item))
        elif isinstance(item, JobSubmitted):
            spec = item.job
            got = store.submit(command=["train"], name=spec.name, memory_gb=spec.memory_gb,
                               memory_gib=spec.memory_gb, workload=spec.workload, at=t)
            assert got.id == spec.id
            loop.handle(("event", item))
        elif isinstance(item, JobFailed) and item.reason == "cancelled":
            done = threading.Event()
            loop.handle(("cancel", item.job, done))
            assert done.is_set()
        elif isinstance(item, GpuRemoved):
            node = NODE_OF[item.gpu]
            if node not in lost:   # one lost node removes all its GPUs, in the loop's order
                lost.add(node)
                rt.fencing.add(node)
                loop.handle(("node_lost", node, 0.0))
        else:
            loop.handle(("event", item))
    assert not con.errors, con.errors
    return rec.decisions


def _decisions(log: list[tuple[float, object]]) -> list[tuple[float, Decision]]:
    return [(t, d) for t, d in log if isinstance(d, Decision)]


def _check(name: str, jobs: list[TraceJob], cfg: WorldConfig,
           inject: list[tuple[float, Any]], tenancy: TenancyConfig | None = None
           ) -> list[tuple[float, object]]:
    log = _simulate(name, jobs, cfg, inject, tenancy)
    sim = _decisions(log)
    live = _replay(name, jobs, cfg, log, tenancy)
    assert len(sim) > 20
    for i, (a, b) in enumerate(zip(sim, live, strict=False)):
        # repr, not ==: a decision's explanation (``why``) is left out of its equality
        assert repr(a) == repr(b), f"decision {i} differs:\nsim:  {a}\nlive: {b}"
    assert len(sim) == len(live)
    return log


@pytest.mark.parametrize("name", POLICIES)
def test_parity__random_stream(name: str):
    """Poisson arrivals, phase changes (speed-change events), jobs that cannot checkpoint."""
    jobs = _trace(40, seed=5)
    cfg = WorldConfig(n_gpus=4, restart_s=60.0, phase_change_prob=0.3, no_checkpoint_frac=0.3)
    _check(name, jobs, cfg, [])


@pytest.mark.parametrize("name", POLICIES)
def test_parity__failures_cancellations_and_a_lost_node(name: str):
    jobs = _trace(40, seed=7)
    cfg = WorldConfig(n_gpus=6, restart_s=60.0, no_checkpoint_frac=0.2)
    mid = jobs[20].submit_s
    inject = [
        (jobs[3].submit_s + 200.0, JobFailed(jobs[3].id, "exit code 1")),
        (jobs[10].submit_s + 50.0, JobFailed(jobs[10].id, "exit code 137")),
        (jobs[15].submit_s + 1.0, JobFailed(jobs[15].id, "cancelled")),
        (jobs[30].submit_s + 300.0, JobFailed(jobs[30].id, "cancelled")),
        (mid, GpuRemoved("gpu2")),
        (mid, GpuRemoved("gpu3")),
    ]
    log = _check(name, jobs, cfg, inject)
    seen = [e for _, e in log if isinstance(e, JobFailed | GpuRemoved)]
    assert sum(isinstance(e, GpuRemoved) for e in seen) == 2
    assert sum(isinstance(e, JobFailed) and e.reason == "cancelled" for e in seen) >= 1
    assert sum(isinstance(e, JobFailed) and e.reason != "cancelled" for e in seen) >= 1


@pytest.mark.parametrize("name", POLICIES)
def test_parity__tenancy_fair_share_quota_and_preemption(name: str):
    """Owners, fair share, an in-use quota and high-priority jobs that preempt: the tenancy
    mechanism takes the same decisions in both drivers."""
    jobs = mark_priority(assign_tenants(_trace(40, seed=9), 3, 0.6, seed=9), 0.2, seed=9)
    cfg = WorldConfig(n_gpus=3, restart_s=60.0, no_checkpoint_frac=0.2)
    ten = TenancyConfig(half_life_s=1800.0, weights={"u0": 2.0}, max_in_use={"u1": 1.0},
                        preempt=True, min_run_s=120.0)
    log = _check(name, jobs, cfg, [], ten)
    if name in ("nopart", "miso+"):
        assert any(isinstance(d, RequeueJob) and d.reason.startswith("preempted")
                   for _, d in log)
