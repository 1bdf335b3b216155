"""Scheduling core: state bookkeeping, contract enforcement, policy invariants on random streams."""

from __future__ import annotations

import random

import pytest

from miso.mig import Placement, is_valid
from miso.sched import (
    ApplyLayout,
    ClusterState,
    ContractError,
    GpuAdded,
    JobFinished,
    JobSpec,
    JobSpeedChanged,
    JobSubmitted,
    LayoutApplied,
    LayoutFailed,
    PlaceJob,
    ProfilingFinished,
    RequeueJob,
    RunMps,
    StartProfiling,
    Tick,
    TrueSpeeds,
    WakeUp,
    make_policy,
    policy_names,
)
from miso.sched.speeds import workload_memory_gb
from miso.sched.state import JobStatus
from miso.sched.tenancyconfig import TenancyConfig
from miso.workloads import catalogue


def _state(n_gpus: int = 1) -> ClusterState:
    st = ClusterState()
    for i in range(n_gpus):
        st.observe(0.0, GpuAdded(f"g{i}", "A100-40GB"))
    return st


def _spec(i: int, wl: str = "resnet_train64") -> JobSpec:
    return JobSpec(str(i), f"j{i}", workload_memory_gb(wl), wl)


def test_registry__has_the_six_policies():
    assert {"nopart", "optsta", "mps", "oracle", "miso", "miso+"} <= set(policy_names())
    with pytest.raises(KeyError, match="unknown policy"):
        make_policy("nope")


def test_state__rejects_invalid_layout_and_unknown_plan_ids():
    st = _state()
    st.observe(0.0, JobSubmitted(_spec(1)))
    st.apply(0.0, PlaceJob("1", "g0"))
    bad = (Placement(0, "4g.20gb"), Placement(2, "3g.20gb"))
    with pytest.raises(ContractError, match="invalid layout"):
        st.apply(0.0, ApplyLayout("g0", st.new_plan_id(), bad, {"1": bad[0]}))
    with pytest.raises(ContractError, match="new_plan_id"):
        st.apply(0.0, ApplyLayout("g0", 99, (Placement(0, "7g.40gb"),),
                                  {"1": Placement(0, "7g.40gb")}))


def test_state__rejects_memory_overflow_and_partial_assignment():
    st = _state()
    big = "bert_train8"  # needs a 3g/4g slice (18 GB)
    st.observe(0.0, JobSubmitted(_spec(1, big)))
    st.observe(0.0, JobSubmitted(_spec(2)))
    st.apply(0.0, PlaceJob("1", "g0"))
    pl = Placement(0, "1g.5gb")
    with pytest.raises(ContractError, match="needs"):
        st.apply(0.0, ApplyLayout("g0", st.new_plan_id(), (pl,), {"1": pl}))
    st.apply(0.0, PlaceJob("2", "g0"))
    full = Placement(0, "7g.40gb")
    with pytest.raises(ContractError, match="assignment covers"):
        st.apply(0.0, ApplyLayout("g0", st.new_plan_id(), (full,), {"1": full}))


def test_state__stale_acks_are_ignored_and_failure_leaves_jobs_resident():
    st = _state()
    st.observe(0.0, JobSubmitted(_spec(1)))
    st.apply(0.0, PlaceJob("1", "g0"))
    full = Placement(0, "7g.40gb")
    p1 = st.new_plan_id()
    st.apply(0.0, ApplyLayout("g0", p1, (full,), {"1": full}))
    p2 = st.new_plan_id()
    st.apply(0.0, StartProfiling("g0", p2, ("1",)))
    st.observe(1.0, LayoutApplied("g0", p1))  # superseded
    assert st.gpus["g0"].pending_plan_id == p2
    st.observe(2.0, LayoutFailed("g0", p2, "boom"))
    gs = st.gpus["g0"]
    assert gs.pending is None and gs.layout == () and gs.jobs == ["1"]
    st.apply(2.0, RequeueJob("1"))
    assert st.queue == ["1"] and st.jobs["1"].gpu is None


def _random_driver(policy_name: str, seed: int, n_jobs: int = 40, n_gpus: int = 3,
                   tenancy: TenancyConfig | None = None) -> None:
    """Feed a policy random events (arrivals, finishes, acks, profiles, speed changes) and check
    the invariants after every step: no job on two GPUs, <= 7 jobs per GPU, memory respected,
    valid layouts, plan ids strictly increasing. Then liveness: with no more arrivals, plans
    acknowledged, timers fired and running jobs finishing, every job runs and finishes."""
    rng = random.Random(seed)
    names = sorted(catalogue())
    kw = {"estimator": TrueSpeeds()} if policy_name in ("miso", "miso+") else {}
    if policy_name == "optsta":
        kw["layout"] = (Placement(0, "4g.20gb"), Placement(4, "3g.20gb"))
    pol = make_policy(policy_name, **kw)
    st = ClusterState(tenancy)
    pending: list[object] = []
    timers: list[WakeUp] = []
    last_pid = 0
    now = 0.0

    def deliver(ev: object) -> None:
        nonlocal last_pid
        st.observe(now, ev)  # type: ignore[arg-type]
        for d in pol.decide(now, ev, st):  # type: ignore[arg-type]
            st.apply(now, d)
            pid = getattr(d, "plan_id", None)
            if pid is not None:
                assert pid > last_pid
                last_pid = pid
            if isinstance(d, ApplyLayout):
                assert is_valid(st.gpus[d.gpu].geom, d.layout)
            if isinstance(d, (ApplyLayout, StartProfiling, RunMps)):
                pending.append(d)
            if isinstance(d, WakeUp):
                timers.append(d)
        where: dict[str, str] = {}
        for g, gs in st.gpus.items():
            assert len(gs.jobs) <= 7
            assert st.memory_used(g) <= gs.geom.model.full_profile().memory_gib + 1e-9
            for j in gs.jobs:
                assert j not in where, f"job {j} on {where[j]} and {g}"
                where[j] = g
        assert not set(where) & set(st.queue)

    for i in range(n_gpus):
        deliver(GpuAdded(f"g{i}", "A100-40GB"))
    submitted = 0
    for _ in range(400):
        now += rng.random() * 10
        r = rng.random()
        if r < 0.3 and submitted < n_jobs:
            wl = names[rng.randrange(len(names))]
            owner, prio = ("", 0) if tenancy is None else \
                (f"u{rng.randrange(3)}", rng.choice((0, 0, 0, 100, -100)))
            deliver(JobSubmitted(JobSpec(str(submitted), "x", workload_memory_gb(wl), wl,
                                         owner=owner, priority=prio)))
            submitted += 1
        elif r < 0.6 and pending:
            d = pending.pop(rng.randrange(len(pending)))
            if isinstance(d, StartProfiling):
                deliver(ProfilingFinished(d.gpu, d.plan_id,
                                          {j: (1.0, 0.8, 0.3) for j in d.jobs}))
            elif rng.random() < 0.1:
                deliver(LayoutFailed(d.gpu, d.plan_id, "injected"))  # type: ignore[attr-defined]
            else:
                deliver(LayoutApplied(d.gpu, d.plan_id))  # type: ignore[attr-defined]
        elif r < 0.85:
            running = [j for gs in st.gpus.values() for j in gs.jobs]
            if running:
                deliver(JobFinished(rng.choice(running)))
        else:
            running = [(j, g) for g, gs in st.gpus.items() for j in gs.jobs]
            if running:
                j, g = rng.choice(running)
                deliver(JobSpeedChanged(j, g, 0.5, 1.0))

    # Liveness: drain (acks first, then timers, then one running job finishes at a time).
    assert submitted == n_jobs
    for _ in range(20 * n_jobs):
        if all(js.status is JobStatus.FINISHED for js in st.jobs.values()):
            break
        now += 1.0
        if pending:
            d = pending.pop(0)
            if isinstance(d, StartProfiling):
                deliver(ProfilingFinished(d.gpu, d.plan_id,
                                          {j: (1.0, 0.8, 0.3) for j in d.jobs}))
            else:
                deliver(LayoutApplied(d.gpu, d.plan_id))  # type: ignore[attr-defined]
        elif timers:
            w = timers.pop(0)
            now = max(now, w.at)
            deliver(Tick(w.tag))
        else:
            running = [j for j, js in st.jobs.items() if js.status is JobStatus.RUNNING]
            waiting = sorted(j for j, js in st.jobs.items() if js.status is not JobStatus.FINISHED)
            assert running, f"{policy_name}: stuck, nothing runs; waiting: {waiting}"
            deliver(JobFinished(running[0]))
    left = sorted(j for j, js in st.jobs.items() if js.status is not JobStatus.FINISHED)
    assert not left, f"{policy_name}: jobs never finished: {left}"


@pytest.mark.parametrize("name", ["nopart", "optsta", "mps", "oracle", "miso", "miso+"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_policy__invariants_hold_on_random_event_streams(name: str, seed: int):
    _random_driver(name, seed)


@pytest.mark.parametrize("name", ["nopart", "optsta", "mps", "oracle", "miso", "miso+"])
@pytest.mark.parametrize("seed", [1, 2])
def test_policy__invariants_hold_with_tenancy(name: str, seed: int):
    """Owners, priorities, fair share, an in-use quota and preemption keep the invariants and
    every job still finishes."""
    _random_driver(name, seed, tenancy=TenancyConfig(
        half_life_s=300.0, weights={"u0": 2.0}, max_in_use={"u1": 0.5}, preempt=True,
        min_run_s=5.0))


def test_predictor_estimator__survives_a_level_with_no_progress():
    """A job that made no progress at one MPS level (e.g. still starting) must not make the
    estimator raise: the GPU would stay in profiling forever."""
    import numpy as np

    from miso.mig import geometry as _geometry
    from miso.sched import JobSpec, JobState, PredictorEstimator

    seen = []

    def predictor(raw):
        assert np.all(raw > 0) and np.all(np.isfinite(raw))
        seen.append(raw)
        return np.full((5, raw.shape[1]), 0.5)

    est = PredictorEstimator(predictor)
    jobs = [JobState(JobSpec(id=j, name=j, memory_gb=1.0), submitted_at=0.0) for j in ("a", "b")]
    out = est.estimate(_geometry("A100-40GB"), jobs,
                       {"a": (10.0, 0.0, 4.0), "b": (0.0, 0.0, float("nan"))})
    assert set(out) == {"a", "b"}
    assert seen[0][:, 0].tolist() == [10.0, 4.0, 4.0]
    assert seen[0][:, 1].tolist() == [1.0, 1.0, 1.0]


def test_job_checkpointable_event_updates_the_spec_and_miso_plus_pins_the_job():
    """A driver that learns a job cannot checkpoint tells the core; miso+ then never moves it
    once it has run (the optimizer keeps its instance)."""
    from miso.mig import Placement
    from miso.sched import (
        ApplyLayout,
        ClusterState,
        GpuAdded,
        JobCheckpointable,
        JobSpec,
        JobSubmitted,
        LayoutApplied,
        Tick,
        TrueSpeeds,
        WakeUp,
        make_policy,
    )

    # gnn is slower on any slice than on the whole GPU (resnet_train64 runs as fast on 3g,
    # so with true speeds it may start on 3g).
    st = ClusterState()
    pol = make_policy("miso+", estimator=TrueSpeeds())

    def step(t, ev):  # noqa: ANN001, ANN202
        st.observe(t, ev)
        out = pol.decide(t, ev, st)
        for d in out:
            st.apply(t, d)
        for d in [d for d in out if isinstance(d, WakeUp) and d.at <= t]:
            out += step(t, Tick(d.tag))  # the first arrivals are planned at the instant's end
        return out

    step(0.0, GpuAdded("g0", "A100-40GB"))
    out = step(1.0, JobSubmitted(JobSpec("a", "a", 4.0, "gnn_train128")))
    lay = next(d for d in out if isinstance(d, ApplyLayout))
    step(2.0, LayoutApplied("g0", lay.plan_id))
    step(3.0, JobCheckpointable("a", False))
    assert st.jobs["a"].spec.checkpointable is False
    out = step(4.0, JobSubmitted(JobSpec("b", "b", 4.0, "mobilenet_train64")))
    # a keeps the whole GPU it runs on; b waits (no layout keeps a's 7g instance and adds b):
    # no plan at all, b back in the queue.
    assert not [d for d in out if isinstance(d, ApplyLayout)]
    assert st.jobs["a"].restarts == 0
    assert st.jobs["a"].placement == Placement(0, "7g.40gb")
    assert st.jobs["b"].status is JobStatus.QUEUED
    # Control: had a been able to checkpoint, b's arrival would have repartitioned g0.
    st = ClusterState()
    pol = make_policy("miso+", estimator=TrueSpeeds())
    step(0.0, GpuAdded("g0", "A100-40GB"))
    out = step(1.0, JobSubmitted(JobSpec("a", "a", 4.0, "gnn_train128")))
    step(2.0, LayoutApplied("g0", next(d for d in out if isinstance(d, ApplyLayout)).plan_id))
    out = step(4.0, JobSubmitted(JobSpec("b", "b", 4.0, "mobilenet_train64")))
    assert any(isinstance(d, ApplyLayout) and "b" in d.assignment for d in out)


def test_miso_plus_never_queues_a_job_behind_a_pinned_resident_while_another_gpu_has_room():
    """Two GPUs each with one job; g0's job cannot checkpoint and holds the whole GPU (pinned).
    A newcomer goes to g1, which can take it, not to g0 where it would wait for the pinned
    job to end (both GPUs are equally crowded, g0 comes first)."""
    from miso.sched import JobCheckpointable

    st = _state(2)
    pol = make_policy("miso+", estimator=TrueSpeeds())
    for g in ("g0", "g1"):
        pol.decide(0.0, GpuAdded(g, "A100-40GB"), st)

    def step(t: float, ev: object) -> list[object]:
        st.observe(t, ev)  # type: ignore[arg-type]
        out = pol.decide(t, ev, st)  # type: ignore[arg-type]
        for d in out:
            st.apply(t, d)
        for d in out:
            if isinstance(d, ApplyLayout):
                out += step(t, LayoutApplied(d.gpu, d.plan_id))
        return out

    step(1.0, JobSubmitted(JobSpec("a", "a", 4.0, "gnn_train128")))  # slower on any slice
    step(2.0, JobCheckpointable("a", False))
    step(3.0, JobSubmitted(JobSpec("c", "c", 4.0, "mobilenet_train64")))
    assert st.gpus["g0"].jobs == ["a"] and st.gpus["g1"].jobs == ["c"]
    assert st.gpus["g0"].assignment["a"] == Placement(0, "7g.40gb")
    step(4.0, JobSubmitted(JobSpec("b", "b", 4.0, "bert_train2")))
    assert "b" in st.gpus["g1"].jobs and "b" not in st.queue
    assert st.gpus["g0"].assignment["a"] == Placement(0, "7g.40gb")
    assert st.jobs["a"].restarts == 0
