"""Sim/live parity: the same event stream through the simulator and through the live
controller's event loop, on a virtual clock, gives the same decision log, for every policy.

The simulator runs a trace (with outside events injected: failures, cancellations, a lost node)
and records every event it delivers. The stream is then replayed into a real
:class:`~miso.controller.Controller` (in-memory job store, :class:`VirtualClock`, no agents, a
plan executor that only records): submissions through the store, cancellations as the API's
cancel, the lost node as the poller reports it, acknowledgements as the poller and executor
post them, progress as ``JobProgress`` events. Timers are *not* replayed: the live loop must
raise its own ``Tick`` from its clock when the replay reaches the time the simulator raised it.

The live halves (issue 27): :func:`test_parity__live_factory_and_progress_conversion` builds
the live policy with the controller's own factory (from a :class:`ControllerConfig`, not the
simulator's ``build_policy``), and turns every progress report of a job on a MIG slice into
what its agent reports (iterations left, iterations/s on that slice), which the live loop
converts to full-GPU seconds itself (:func:`miso.sched.progress.full_gpu_work`); the work it
folds must be the simulator's. (The rate it folds is the slice's modelled speed, not the
simulator's true one, so the replay then delivers the simulator's report as well.)
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
from miso.sched.events import JobProgress
from miso.sched.policies import policy_options
from miso.sched.progress import slice_speed
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


#: Iterations per second of full GPU of every job in the replay's agent reports.
ITERATIONS_PER_FULL_GPU_S = 3.0


def _live_config(name: str, cfg: WorldConfig, tenancy: TenancyConfig | None
                 ) -> ControllerConfig:
    """The controller's configuration that makes its own policy factory build what the
    simulator's builds for ``cfg`` (its predictor must be ``"true"``: the noisy oracle's
    seed is the simulator's)."""
    assert cfg.predictor == "true"
    known = policy_options(name)
    args: dict[str, Any] = {"restart_s": cfg.restart_s} if "restart_s" in known else {}
    if "layout" in known:
        args["layout"] = OPTSTA_LAYOUT
    return ControllerConfig(policy=name, policy_args=args, estimator=cfg.predictor,
                            profile_seconds_per_level=cfg.profile_s_per_level,
                            tenancy=tenancy)


def _agent_report(con: Controller, ev: JobProgress) -> tuple[Any, ...] | None:
    """What the agent of a job running on a MIG slice reports for ``ev`` (the live loop's
    ``("progress", job, gpu, placement, mps_pct, iterations_left, iterations/s)``): the job
    runs its slice at the speed the live conversion expects there, so converted back it is
    ``ev.work_s`` again. None for a job not on a slice (stopped, under MPS, unknown)."""
    state = con.loop.state
    js = state.jobs.get(ev.job)
    if ev.rate <= 0 or js is None or js.gpu is None or js.placement is None:
        return None
    gs = state.gpus.get(js.gpu)
    if gs is None:
        return None
    speed = slice_speed(gs.geom, js.placement, None, js.observed)
    rate = ITERATIONS_PER_FULL_GPU_S * speed
    return ("progress", ev.job, js.gpu, js.placement, None,
            ev.work_s * ITERATIONS_PER_FULL_GPU_S, rate)


def _replay(name: str, jobs: list[TraceJob], cfg: WorldConfig,
            log: list[tuple[float, object]], tenancy: TenancyConfig | None = None,
            *, live_halves: bool = False, converted: list[float] | None = None,
            ) -> list[tuple[float, Decision]]:
    """The live loop's decisions on the simulator's event stream ``log``. With
    ``live_halves`` its policy is the controller's own (:func:`_live_config`) and progress
    on a slice arrives as the agent reports it; ``converted`` then gets the slice speed of
    every report so converted."""
    clock = VirtualClock()
    store = JobStore(":memory:")
    if live_halves:
        con = Controller(store, None, _live_config(name, cfg, tenancy),  # type: ignore[arg-type]
                         checkpoint_root="/nonexistent", clock=clock)
    else:
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
        elif live_halves and isinstance(item, JobProgress) and \
                (report := _agent_report(con, item)) is not None:
            loop.handle(report)
            speed = report[-1] / ITERATIONS_PER_FULL_GPU_S
            folded = loop.state.jobs[item.job].progress
            assert folded is not None and folded[0] == t and folded[2] == speed
            assert folded[1] == pytest.approx(item.work_s, rel=1e-9, abs=1e-9), (
                f"{item.job} on a slice of speed {speed}: the live conversion gives "
                f"{folded[1]} full-GPU s left, the simulator {item.work_s}")
            if converted is not None:
                converted.append(speed)
            # the simulator's rate is the job's true speed there, the live one the model's
            # (a measured ratio, else the slice's compute share): the stream goes on with
            # the simulator's, so the decisions can be compared
            loop.handle(("event", item))
        else:
            loop.handle(("event", item))
    assert not con.errors, con.errors
    return rec.decisions


def _decisions(log: list[tuple[float, object]]) -> list[tuple[float, Decision]]:
    return [(t, d) for t, d in log if isinstance(d, Decision)]


def _check(name: str, jobs: list[TraceJob], cfg: WorldConfig,
           inject: list[tuple[float, Any]], tenancy: TenancyConfig | None = None,
           **replay: Any) -> list[tuple[float, object]]:
    log = _simulate(name, jobs, cfg, inject, tenancy)
    sim = _decisions(log)
    live = _replay(name, jobs, cfg, log, tenancy, **replay)
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


@pytest.mark.parametrize("name", POLICIES)
def test_parity__live_factory_and_progress_conversion(name: str):
    """The live halves: the controller's own policy factory, and progress on MIG slices as
    the agents report it (iterations), converted by the live loop. Slices slower than the
    full GPU must be among the conversions, or a conversion that ignored the slice's speed
    would pass."""
    jobs = _trace(40, seed=5)
    cfg = WorldConfig(n_gpus=4, restart_s=60.0, phase_change_prob=0.3, no_checkpoint_frac=0.3,
                      predictor="true")
    speeds: list[float] = []
    _check(name, jobs, cfg, [], live_halves=True, converted=speeds)
    if name not in ("nopart", "mps"):   # those never run a job on a smaller MIG slice
        assert sum(s < 1.0 for s in speeds) >= 10, speeds
