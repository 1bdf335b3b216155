"""Submissions of one instant as one batch (issue 32): the driver step's
:meth:`~miso.sched.driver.DriverStep.arrivals` observes and decides each, but the policy
leaves its placement pass to the last one, which looks as many more jobs down the queue.

The live loop takes the submissions waiting in its queue as such a batch; the simulator does
the same for arrivals at one instant with ``coalesce_arrivals`` (off by default: its decisions
stay those of one event at a time). Parity: the same stream with same-instant groups gives the
same decisions in the simulator (coalescing) and in the live loop (the group waiting in its
queue when it comes round); and a batch places as many jobs as one-at-a-time delivery.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from helpers import AcceptingExecutor, DecisionRecorder

from miso.controller import Controller, ControllerConfig
from miso.controller.runtime import GpuRef
from miso.controller.store import JobStore
from miso.mig import geometry
from miso.sched import Decision, GpuAdded, JobSubmitted, PlaceJob, Tick
from miso.sched.clock import VirtualClock
from miso.sim.engine import Simulator
from miso.sim.run import build_policy
from miso.sim.traces import TraceJob, poisson_jobs
from miso.sim.world import WorldConfig


def grouped_trace(n: int, group: int, seed: int) -> list[TraceJob]:
    """Poisson jobs whose arrivals come ``group`` at a time (each group at its first one's
    instant); ids are those the live store gives (j0001, ... in order)."""
    jobs = sorted(poisson_jobs(n, seed=seed, mean_interarrival_s=6.0),
                  key=lambda j: (j.submit_s, int(j.id)))
    return [TraceJob(f"j{i + 1:04d}", jobs[i - i % group].submit_s, j.duration_s, j.workload)
            for i, j in enumerate(jobs)]


def simulate(name: str, jobs: list[TraceJob], cfg: WorldConfig, *, coalesce: bool
             ) -> list[tuple[float, object]]:
    sim = Simulator(build_policy(name, jobs, cfg, 3), jobs, cfg, seed=3, record=True,
                    coalesce_arrivals=coalesce)
    return sim.run().log


def replay(name: str, jobs: list[TraceJob], cfg: WorldConfig,
           log: list[tuple[float, object]]) -> list[tuple[float, Any]]:
    """The simulator's events into a live controller's loop on a virtual clock; the
    submissions of one instant are put in the loop's queue together, then it comes round."""
    clock = VirtualClock()
    store = JobStore(":memory:")
    con = Controller(store, None, ControllerConfig(policy=name),  # type: ignore[arg-type]
                     checkpoint_root="/nonexistent", clock=clock,
                     policy=build_policy(name, jobs, cfg, 3))
    rec = DecisionRecorder()
    con.observer = rec
    con.loop.executor = AcceptingExecutor()  # type: ignore[assignment]
    loop, rt = con.loop, con.rt
    geom = geometry(cfg.gpu_model)
    items = [(t, it) for t, it in log if not isinstance(it, Decision)]
    i = 0
    while i < len(items):
        t, item = items[i]
        clock.advance_to(t)
        if isinstance(item, JobSubmitted):
            k = i
            while k < len(items) and items[k][0] == t and isinstance(items[k][1], JobSubmitted):
                spec = items[k][1].job  # type: ignore[attr-defined]
                got = store.submit(command=["train"], name=spec.name, memory_gb=spec.memory_gb,
                                   memory_gib=spec.memory_gb, workload=spec.workload, at=t)
                assert got.id == spec.id
                rt.queue.put(("event", items[k][1], time.monotonic()))
                k += 1
            assert loop.run_once() and rt.queue.empty()  # the whole group in one turn
            i = k
            continue
        if isinstance(item, Tick):
            assert loop.run_due(), f"the live loop raised no timer at {t} ({item})"
        elif isinstance(item, GpuAdded):
            rt.gpus[item.gpu] = GpuRef(item.gpu, "n0", 0, item.model, geom)
            loop.handle(("event", item))
        else:
            loop.handle(("event", item))
        i += 1
    assert not con.errors, con.errors
    return rec.decisions


@pytest.mark.parametrize("name", ["nopart", "optsta", "miso+"])
def test_batch__live_loop_decides_as_the_coalescing_simulator(name: str) -> None:
    """Groups of 4 same-instant arrivals: the live loop, finding each group waiting in its
    queue, decides exactly as the simulator with ``coalesce_arrivals``."""
    jobs = grouped_trace(48, group=4, seed=7)
    cfg = WorldConfig(n_gpus=4, restart_s=30.0)
    log = simulate(name, jobs, cfg, coalesce=True)
    sim = [(t, d) for t, d in log if isinstance(d, Decision)]
    live = replay(name, jobs, cfg, log)
    assert len(sim) > 20
    for n, (a, b) in enumerate(zip(sim, live, strict=False)):
        assert repr(a) == repr(b), f"decision {n} differs:\nsim:  {a}\nlive: {b}"
    assert len(sim) == len(live)


def test_batch__coalescing_changes_decisions_only_with_same_instant_arrivals() -> None:
    """With no two arrivals at one instant the option changes nothing; with groups it leaves
    the placement passes to each group's last submission (fewer, larger plans)."""
    cfg = WorldConfig(n_gpus=4, restart_s=30.0)
    single = grouped_trace(30, group=1, seed=2)
    assert repr(simulate("miso+", single, cfg, coalesce=True)) == \
        repr(simulate("miso+", single, cfg, coalesce=False))
    grouped = grouped_trace(30, group=5, seed=2)
    assert repr(simulate("miso+", grouped, cfg, coalesce=True)) != \
        repr(simulate("miso+", grouped, cfg, coalesce=False))


@pytest.mark.parametrize("name", ["nopart", "miso+"])
def test_batch__a_burst_larger_than_the_backfill_window_is_placed_alike(name: str) -> None:
    """200 jobs at one instant on 96 GPUs: the batch's one pass looks past the 64-job
    backfill window (as far as the batch reaches), so as many jobs start at that instant
    as when each arrival had its own pass."""
    jobs = [TraceJob(f"j{i + 1:04d}", 0.0, 600.0, j.workload)
            for i, j in enumerate(poisson_jobs(200, seed=4))]
    cfg = WorldConfig(n_gpus=96, restart_s=30.0)

    def placed_at_once(coalesce: bool) -> int:
        log = simulate(name, jobs, cfg, coalesce=coalesce)
        return sum(1 for t, d in log if t == 0.0 and isinstance(d, PlaceJob))

    alone = placed_at_once(False)
    assert alone > 64  # more than one backfill window's worth starts at once
    assert placed_at_once(True) == alone


def test_batch__a_submission_that_fails_drops_only_itself() -> None:
    """The policy fails on the second of three waiting submissions: the error is shown, and
    the third is still observed and decided (on its own), as when each was one item."""
    jobs = grouped_trace(3, group=3, seed=1)
    cfg = WorldConfig(n_gpus=3, restart_s=30.0)
    con = Controller(JobStore(":memory:"), None, ControllerConfig(policy="nopart"),  # type: ignore[arg-type]
                     checkpoint_root="/nonexistent", clock=VirtualClock(),
                     policy=build_policy("nopart", jobs, cfg, 3))
    con.loop.executor = AcceptingExecutor()  # type: ignore[assignment]
    geom = geometry(cfg.gpu_model)
    for g in ("gpu0", "gpu1", "gpu2"):
        con.rt.gpus[g] = GpuRef(g, "n0", 0, geom.model.name, geom)
        con.loop.handle(("event", GpuAdded(g, geom.model.name)))
    decide = con.policy.decide

    def failing(now: float, ev: Any, st: Any) -> Any:
        if isinstance(ev, JobSubmitted) and ev.job.id == "j0002":
            raise RuntimeError("policy bug")
        return decide(now, ev, st)
    con.policy.decide = failing  # type: ignore[method-assign]
    con.loop.step.policy = con.policy
    for tj in jobs:
        rec = con.store.submit(command=["train"], name=tj.id, memory_gb=4.0, memory_gib=4.0,
                               workload=tj.workload, at=0.0)
        spec = Simulator(build_policy("nopart", jobs, cfg, 3), jobs, cfg).jobs[tj.id].spec
        assert rec.id == spec.id
        con.rt.queue.put(("event", JobSubmitted(spec), time.monotonic()))
    assert con.loop.run_once() and con.rt.queue.empty()
    st = con.loop.state
    assert {"j0001", "j0002", "j0003"} <= set(st.jobs)
    assert any("policy bug" in e for e in con.errors)
    # the third decided on its own after the failed batch: every job is placed
    assert all(st.jobs[j].gpu is not None for j in ("j0001", "j0002", "j0003"))
