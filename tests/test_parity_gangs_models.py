"""Sim/live parity with gangs and two GPU models: the simulator's event stream on 4
A100-40GB + 4 H100-80GB (two nodes) with 2- and 4-GPU jobs among one-GPU ones, replayed into the
live controller's event loop (in-memory store, virtual clock, a recording executor), gives the
same decisions, for MISO and miso+ (model-aware placement and moves, the gang layer's
reservations, backfill and all-or-nothing starts). The one-model streams: test_parity.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from helpers import AcceptingExecutor, DecisionRecorder

from miso.controller import Controller, ControllerConfig
from miso.controller.runtime import GpuRef
from miso.controller.store import JobStore
from miso.mig import geometry
from miso.sched import Decision, GpuAdded, JobSubmitted, Tick
from miso.sched.clock import VirtualClock
from miso.sched.decisions import StartGang
from miso.sched.gangs import with_gangs
from miso.sim.engine import Simulator
from miso.sim.run import build_policy
from miso.sim.traces import TraceJob, poisson_jobs
from miso.sim.world import WorldConfig

MIX = (("A100-40GB", 4), ("H100-80GB", 4))
CFG = WorldConfig(gpu_model="A100-40GB", n_gpus=8, gpu_mix=MIX, restart_s=60.0)


def node_of(gpu: str) -> str:
    return f"n{int(gpu[3:]) // 4}"   # n0: the A100s, n1: the H100s


def _trace() -> list[TraceJob]:
    """Poisson jobs (ids as the live store gives them), every fifth a gang of 2 or 4 GPUs."""
    jobs = sorted(poisson_jobs(40, seed=11, mean_interarrival_s=40.0),
                  key=lambda j: (j.submit_s, int(j.id)))
    return [replace(j, id=f"j{i + 1:04d}", num_gpus=(1 if i % 5 else (2, 4)[i // 5 % 2]))
            for i, j in enumerate(jobs)]


def _policy(name: str, jobs: list[TraceJob]) -> Any:
    return with_gangs(build_policy(name, jobs, CFG, 3), node_of=node_of)


def _replay(name: str, jobs: list[TraceJob], log: list[tuple[float, object]]
            ) -> list[tuple[float, Decision]]:
    clock = VirtualClock()
    store = JobStore(":memory:")
    con = Controller(store, None, ControllerConfig(policy=name),  # type: ignore[arg-type]
                     checkpoint_root="/nonexistent", clock=clock, policy=_policy(name, jobs))
    rec = DecisionRecorder()
    con.observer = rec
    con.loop.executor = AcceptingExecutor()  # type: ignore[assignment]
    loop, rt = con.loop, con.rt
    ticked = None
    for t, item in log:
        if isinstance(item, Decision):
            continue
        clock.advance_to(t)
        if isinstance(item, Tick):
            # timers due at one instant (a gang's GPUs) are handled together live
            if loop.run_due():
                ticked = t
            assert ticked == t, f"the live loop raised no timer at {t} ({item})"
            continue
        if isinstance(item, GpuAdded):
            rt.gpus[item.gpu] = GpuRef(item.gpu, node_of(item.gpu), 0, item.model,
                                       geometry(item.model))
        elif isinstance(item, JobSubmitted):
            spec = item.job
            got = store.submit(command=["train"], name=spec.name, memory_gb=spec.memory_gb,
                               memory_gib=spec.memory_gb, workload=spec.workload, at=t,
                               num_gpus=spec.num_gpus)
            assert got.id == spec.id
        loop.handle(("event", item))
    assert not con.errors, con.errors
    return rec.decisions


@pytest.mark.parametrize("name", ["miso", "miso+"])
def test_parity__gangs_on_two_gpu_models(name: str):
    jobs = _trace()
    log = Simulator(_policy(name, jobs), jobs, CFG, seed=3, record=True).run().log
    sim = [(t, d) for t, d in log if isinstance(d, Decision)]
    assert {d.job for _, d in sim if isinstance(d, StartGang)} >= \
        {j.id for j in jobs if j.num_gpus > 1}
    placed = {d.gpu for _, d in sim if type(d).__name__ == "PlaceJob"}
    assert placed & {"gpu0", "gpu1", "gpu2", "gpu3"} and placed & {"gpu4", "gpu5", "gpu6"}
    live = _replay(name, jobs, log)
    for i, (a, b) in enumerate(zip(sim, live, strict=False)):
        assert repr(a) == repr(b), f"decision {i} differs:\nsim:  {a}\nlive: {b}"
    assert len(sim) == len(live)
