"""Inference services through the scheduling core (issue 28): replicas in ClusterState, the
ServicesFirst policy through the one DriverStep, training in the slices replicas leave free,
replicas charged to their owner, the restart economy choosing where a replica goes."""

from __future__ import annotations

import random

import pytest
from helpers import AcceptingExecutor, DecisionRecorder

from miso.mig import Placement, geometry, is_valid
from miso.sched import (
    ApplyLayout,
    ClusterState,
    ContractError,
    GpuAdded,
    JobFinished,
    JobSpec,
    JobSubmitted,
    LayoutApplied,
    LayoutFailed,
    ProfilingFinished,
    RequeueJob,
    StartProfiling,
    Tick,
    TrueSpeeds,
    WakeUp,
    make_policy,
)
from miso.sched.driver import DriverStep
from miso.sched.servicepolicy import ServicesFirst
from miso.sched.services import (
    DrainReplica,
    ReplicaDrained,
    ReplicaReady,
    ServiceRateObserved,
    ServiceSpec,
    ServiceStopped,
    ServiceSubmitted,
    StartReplica,
)
from miso.sched.speeds import workload_memory_gb
from miso.sched.state import JobStatus
from miso.sched.tenancyconfig import TenancyConfig
from miso.workloads import catalogue

SERVICES = (
    ServiceSpec("qa", "carol", "bert-large", 50, min_replicas=2, headroom=0.2),
    ServiceSpec("vision", "dave", "resnet50", 10, min_replicas=1, headroom=0.2),
)
#: rates that need from one small replica to most of a GPU (A100-40GB catalogue capacities)
RATES = {"qa": (50.0, 1500.0), "vision": (100.0, 9000.0)}


def _policy(name: str = "miso+") -> ServicesFirst:
    kw = {} if name == "oracle" else {"estimator": TrueSpeeds()}
    return ServicesFirst(make_policy(name, **kw))


def _check(st: ClusterState, pol: ServicesFirst) -> None:
    """Invariants after every step: every GPU's replicas and training instances (applied and
    pending) form a valid layout of the whole GPU; no job on two GPUs; the state's replicas
    are the planner's; each owner's in-use charge holds its replicas' slices."""
    where: dict[str, str] = {}
    book = st.services
    for g, gs in st.gpus.items():
        base = gs.base or gs.geom
        slots = book.slots(g)
        used = [pl for j, pl in gs.assignment.items() if j in gs.jobs]
        assert is_valid(base, [*slots, *used]), (g, slots, used)
        if isinstance(gs.pending, ApplyLayout):
            assert is_valid(base, [*slots, *gs.pending.layout]), (g, slots, gs.pending.layout)
        assert (gs.base is None) == (not slots)
        for j in gs.jobs:
            assert j not in where
            where[j] = g
    planned = {rid for s in pol.planner.services.values() for rid in s.replicas}
    assert planned == set(book.replicas)
    ten = st.tenancy
    if ten is not None:
        need: dict[str, float] = {}
        for r in book.replicas.values():
            m = (st.gpus[r.gpu].base or st.gpus[r.gpu].geom).model
            need[r.owner] = need.get(r.owner, 0.0) + \
                m.profile(r.slot.profile).compute_slices / m.full_profile().compute_slices
        for o, c in need.items():
            assert ten.in_use.get(o, 0.0) >= c - 1e-9, (o, ten.in_use.get(o), c)


def _covered(pol: ServicesFirst, name: str) -> bool:
    s = pol.planner.services[name]
    if s.stopped:
        return True
    return s.covered() + 1e-9 >= pol.planner.target(s) or len(s.live()) >= s.spec.max_replicas


def _random_stream(policy: str, seed: int, tenancy: TenancyConfig | None = None,
                   n_jobs: int = 30, n_gpus: int = 4) -> None:
    rng = random.Random(seed)
    names = sorted(catalogue())
    pol = _policy(policy)
    st = ClusterState(tenancy)
    errors: list[str] = []
    pending: list[object] = []
    timers: list[WakeUp] = []
    starting: list[StartReplica] = []
    draining: list[DrainReplica] = []
    now = 0.0

    def execute(t: float, d: object, ctx: object) -> None:
        if isinstance(d, ApplyLayout | StartProfiling):
            pending.append(d)
        elif isinstance(d, WakeUp):
            timers.append(d)
        elif isinstance(d, StartReplica):
            starting.append(d)
        elif isinstance(d, DrainReplica):
            draining.append(d)

    log: list[tuple[float, object]] = []
    step = DriverStep(st, pol, execute=execute, record=lambda t, x: log.append((t, x)),
                      on_contract_error=lambda t, d, e: errors.append(str(e)))

    def deliver(ev: object) -> None:
        step(now, ev)  # type: ignore[arg-type]
        assert not errors, errors
        _check(st, pol)

    for i in range(n_gpus):
        deliver(GpuAdded(f"g{i}", "A100-40GB"))
    for s in SERVICES:
        deliver(ServiceSubmitted(s))
    submitted = 0
    for _ in range(500):
        now += rng.random() * 10
        r = rng.random()
        if r < 0.2 and submitted < n_jobs:
            wl = names[rng.randrange(len(names))]
            owner = "" if tenancy is None else f"u{rng.randrange(2)}"
            deliver(JobSubmitted(JobSpec(str(submitted), "x", workload_memory_gb(wl), wl,
                                         owner=owner)))
            submitted += 1
        elif r < 0.4 and pending:
            d = pending.pop(rng.randrange(len(pending)))
            if isinstance(d, StartProfiling):
                deliver(ProfilingFinished(d.gpu, d.plan_id, {j: (1.0, 0.8, 0.3) for j in d.jobs}))
            elif rng.random() < 0.1:
                deliver(LayoutFailed(d.gpu, d.plan_id, "injected"))  # type: ignore[attr-defined]
            else:
                deliver(LayoutApplied(d.gpu, d.plan_id))  # type: ignore[attr-defined]
        elif r < 0.55:
            running = [j for gs in st.gpus.values() for j in gs.jobs]
            if running:
                deliver(JobFinished(rng.choice(running)))
        elif r < 0.75:
            s = rng.choice(SERVICES)
            lo, hi = RATES[s.name]
            deliver(ServiceRateObserved(s.name, rng.uniform(lo, hi)))
            assert _covered(pol, s.name) or _full(st), s.name
        elif r < 0.85 and starting:
            d = starting.pop(rng.randrange(len(starting)))
            deliver(ReplicaReady(d.service, d.replica))
        elif r < 0.95 and draining:
            d2 = draining.pop(rng.randrange(len(draining)))
            deliver(ReplicaDrained(d2.service, d2.replica))
        elif timers:
            w = timers.pop(0)
            deliver(Tick(w.tag))
    deliver(ServiceStopped("vision"))
    # Liveness: every replica acknowledged, every job runs and finishes.
    for _ in range(40 * n_jobs):
        if all(js.status is JobStatus.FINISHED for js in st.jobs.values()) and not (
                pending or starting or draining or timers):
            break
        now += 1.0
        if starting:
            d = starting.pop(0)
            deliver(ReplicaReady(d.service, d.replica))
        elif draining:
            d2 = draining.pop(0)
            deliver(ReplicaDrained(d2.service, d2.replica))
        elif pending:
            d = pending.pop(0)
            if isinstance(d, StartProfiling):
                deliver(ProfilingFinished(d.gpu, d.plan_id, {j: (1.0, 0.8, 0.3) for j in d.jobs}))
            else:
                deliver(LayoutApplied(d.gpu, d.plan_id))  # type: ignore[attr-defined]
        elif timers:
            w = timers.pop(0)
            now = max(now, w.at)
            deliver(Tick(w.tag))
        else:
            running = [j for j, js in st.jobs.items() if js.status is JobStatus.RUNNING]
            assert running, f"stuck: {sorted(st.queue)} " + "\n".join(
                f"{t:.0f} {x}" for t, x in log[-40:])
            deliver(JobFinished(running[0]))
    left = sorted(j for j, js in st.jobs.items() if js.status is not JobStatus.FINISHED)
    assert not left, f"jobs never finished: {left}"
    assert not [r for r in st.services.replicas.values() if r.service == "vision"]


def _full(st: ClusterState) -> bool:
    """No GPU can take one more replica now (all busy or full of replicas)."""
    return all(gs.pending is not None or len(st.services.slots(g)) >= 3
               for g, gs in st.gpus.items())


@pytest.mark.parametrize("policy", ["miso+", "miso", "oracle"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_services_first__invariants_and_covering_hold_on_random_streams(policy: str, seed: int):
    _random_stream(policy, seed)


@pytest.mark.parametrize("seed", [1, 2])
def test_services_first__with_tenancy_replicas_are_charged_to_their_owner(seed: int):
    _random_stream("miso+", seed, tenancy=TenancyConfig(half_life_s=300.0,
                                                        max_in_use={"u1": 1.0}))


def _one_gpu_state(tenancy: TenancyConfig | None = None) -> ClusterState:
    st = ClusterState(tenancy)
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    st.observe(0.0, ServiceSubmitted(SERVICES[1]))
    return st


def test_state__a_replica_reserves_its_slice_from_training_and_gives_it_back():
    st = _one_gpu_state(TenancyConfig(half_life_s=300.0))
    slot = Placement(4, "3g.20gb")
    st.apply(0.0, StartReplica("vision", "vision-r0", "g0", slot))
    gs = st.gpus["g0"]
    assert gs.base == geometry("A100-40GB") and gs.geom.model.max_instances == 6
    assert st.tenancy is not None and st.tenancy.in_use["dave"] == pytest.approx(3 / 7)
    with pytest.raises(ContractError, match="replica id already in use"):
        st.apply(0.0, StartReplica("vision", "vision-r0", "g0", Placement(0, "1g.5gb")))
    with pytest.raises(ContractError, match="does not fit"):
        st.apply(0.0, StartReplica("vision", "vision-r1", "g0", Placement(5, "1g.5gb")))
    st.observe(0.0, JobSubmitted(JobSpec("1", "j", workload_memory_gb("resnet_train64"),
                                         "resnet_train64")))
    from miso.sched import PlaceJob
    st.apply(0.0, PlaceJob("1", "g0"))
    full = Placement(0, "7g.40gb")
    with pytest.raises(ContractError, match="invalid layout"):
        st.apply(0.0, ApplyLayout("g0", st.new_plan_id(), (full,), {"1": full}))
    four = Placement(0, "4g.20gb")
    st.apply(0.0, ApplyLayout("g0", st.new_plan_id(), (four,), {"1": four}))
    with pytest.raises(ContractError, match="plan is in flight"):
        st.apply(0.0, StartReplica("vision", "vision-r1", "g0", Placement(0, "1g.5gb")))
    st.apply(1.0, DrainReplica("vision", "vision-r0"))
    st.observe(2.0, ReplicaDrained("vision", "vision-r0"))
    assert gs.base is None and gs.geom == geometry("A100-40GB")
    assert st.tenancy.in_use.get("dave", 0.0) == 0.0


@pytest.mark.parametrize("pin2", [False, True])
def test_services_first__a_replica_goes_where_it_stops_the_least_training(pin2: bool):
    """g0 runs job 1 on 4g@0 and job 2 on 3g@4; g1 runs job 3 on its whole GPU. A llama2-7b
    service needs one 3g slice (its smallest that holds the model): 3g@4 of g0 stops job 2
    (one restart, 3/7 of a GPU), 3g@0 of g0 stops job 1 (4/7), either slot of g1 stops job 3
    (7/7). It takes 3g@4 of g0, and job 2 is checkpointed just before. When job 2 cannot
    checkpoint (it would lose all its progress) it takes 3g@0 and stops job 1 instead."""
    from miso.sched import PlaceJob

    pol = _policy()
    st = ClusterState()
    for g in ("g0", "g1"):
        st.observe(0.0, GpuAdded(g, "A100-40GB"))
        pol.decide(0.0, GpuAdded(g, "A100-40GB"), st)
    layout = {"g0": {"1": Placement(0, "4g.20gb"), "2": Placement(4, "3g.20gb")},
              "g1": {"3": Placement(0, "7g.40gb")}}
    for g, asg in layout.items():
        for j in asg:
            st.observe(0.0, JobSubmitted(JobSpec(j, "j", 4.0, "resnet_train64",
                                                 checkpointable=not (pin2 and j == "2"))))
            st.apply(0.0, PlaceJob(j, g))
        pid = st.new_plan_id()
        st.apply(0.0, ApplyLayout(g, pid, tuple(asg.values()), asg))
        st.observe(1.0, LayoutApplied(g, pid))
    spec = ServiceSpec("chat", "alice", "llama2-7b", 10_000, min_replicas=1, headroom=0.0)
    ev = ServiceSubmitted(spec)
    st.observe(2.0, ev)
    ds = pol.decide(2.0, ev, st)
    starts = [d for d in ds if isinstance(d, StartReplica)]
    slot, stopped = (Placement(0, "3g.20gb"), "1") if pin2 else (Placement(4, "3g.20gb"), "2")
    assert [(d.gpu, d.slot) for d in starts] == [("g0", slot)]
    assert [d.job for d in ds if isinstance(d, RequeueJob)] == [stopped]
    assert ds.index(starts[0]) > [i for i, d in enumerate(ds) if isinstance(d, RequeueJob)][0]
    for d in ds:  # the decisions keep the contract, in order
        st.apply(2.0, d)
    kept = "2" if pin2 else "1"
    assert st.gpus["g0"].assignment == {kept: layout["g0"][kept]}
    assert st.jobs[stopped].status is JobStatus.QUEUED


# -- parity: the simulator and the live controller, services in the stream ----------------------


def test_parity__services_and_training_give_the_same_decisions_sim_and_live():
    """One simulated run of two services (a 5x rate step) beside a Poisson training stream
    on 4 GPUs, replayed event by event into the live controller's loop (virtual clock, the
    same ServicesFirst policy): the same decisions, replicas and checkpoints included."""
    from miso.controller import Controller, ControllerConfig
    from miso.controller.runtime import GpuRef
    from miso.controller.store import JobStore
    from miso.sched import Decision
    from miso.sched.clock import VirtualClock
    from miso.serving.traces import step_trace
    from miso.sim.run import build_policy
    from miso.sim.servicecluster import ServicesSimulator
    from miso.sim.traces import TraceJob, poisson_jobs
    from miso.sim.world import WorldConfig

    span = 900.0
    svcs = [(SERVICES[0], step_trace(150.0, span, 400.0, 5.0, 400.0, seed=1)),
            (SERVICES[1], step_trace(1500.0, span, 300.0, 5.0, 500.0, seed=2))]
    raw = sorted(poisson_jobs(20, seed=4, mean_interarrival_s=30.0),
                 key=lambda j: (j.submit_s, int(j.id)))
    jobs = [TraceJob(f"j{i + 1:04d}", j.submit_s, j.duration_s, j.workload)
            for i, j in enumerate(raw)]
    cfg = WorldConfig(n_gpus=4, restart_s=60.0)

    def policy() -> ServicesFirst:
        return ServicesFirst(build_policy("miso+", jobs, cfg, 3))

    sim = ServicesSimulator(policy(), jobs, cfg, svcs, span, record=True, seed=3)
    log = sim.run().log
    sim_decisions = [(t, d) for t, d in log if isinstance(d, Decision)]
    assert any(isinstance(d, StartReplica) for _, d in sim_decisions)
    assert any(isinstance(d, DrainReplica) for _, d in sim_decisions)
    # replicas took slices from training (checkpoints) in this stream
    assert any(isinstance(d, RequeueJob) and "replica" in d.reason for _, d in sim_decisions)

    clock = VirtualClock()
    store = JobStore(":memory:")
    con = Controller(store, None, ControllerConfig(policy="miso+"),  # type: ignore[arg-type]
                     checkpoint_root="/nonexistent", clock=clock, policy=policy())
    rec = DecisionRecorder()
    con.observer = rec
    con.loop.executor = AcceptingExecutor()  # type: ignore[assignment]
    loop, rt = con.loop, con.rt
    geom = geometry(cfg.gpu_model)
    for t, item in log:
        if isinstance(item, Decision):
            continue
        clock.advance_to(t)
        if isinstance(item, Tick):
            assert loop.run_due(), f"the live loop raised no timer at {t} ({item})"
            continue
        if isinstance(item, GpuAdded):
            rt.gpus[item.gpu] = GpuRef(item.gpu, "n0", 0, item.model, geom)
        elif isinstance(item, JobSubmitted):
            spec = item.job
            got = store.submit(command=["train"], name=spec.name, memory_gb=spec.memory_gb,
                               memory_gib=spec.memory_gb, workload=spec.workload, at=t)
            assert got.id == spec.id
        loop.handle(("event", item))
    assert not con.errors, con.errors
    live = rec.decisions
    for i, (a, b) in enumerate(zip(sim_decisions, live, strict=False)):
        assert repr(a) == repr(b), f"decision {i} differs:\nsim:  {a}\nlive: {b}"
    assert len(sim_decisions) == len(live)
    # the live state holds the same replicas on the same slices as the simulator's
    assert {r: (x.gpu, x.slot) for r, x in con.loop.state.services.replicas.items()} == \
        {r: (x.gpu, x.slot) for r, x in sim.state.services.replicas.items()}


def test_sim__training_packs_the_slices_beside_replicas_and_services_are_served():
    """A simulated run of services and training through the core: some training layouts are
    applied on GPUs that host replicas (training uses their free slices), every job finishes,
    and the replicas' records serve every request."""
    from miso.serving.traces import step_trace
    from miso.sim.servicecluster import run_shared
    from miso.sim.traces import poisson_jobs
    from miso.sim.world import WorldConfig

    span = 400.0
    svcs = [(SERVICES[0], step_trace(30.0, span, 100.0, 5.0, 150.0, seed=1)),
            (SERVICES[1], step_trace(100.0, span, 200.0, 3.0, None, seed=2))]
    jobs = poisson_jobs(12, seed=2, mean_interarrival_s=20.0)
    cfg = WorldConfig(n_gpus=3, restart_s=60.0)
    beside: list[str] = []

    class Watch:
        def on_event(self, now: float, ev: object, state: ClusterState) -> None:
            pass

        def on_decision(self, now: float, d: object, state: ClusterState) -> None:
            if isinstance(d, ApplyLayout) and state.gpus[d.gpu].base is not None and \
                    d.assignment:
                beside.append(d.gpu)

        def on_timing(self, name: str, seconds: float) -> None:
            pass

    from miso.sched.serviceplan import catalogue_capacity

    run, res = run_shared(svcs, jobs, cfg, span, seed=2, capacity=catalogue_capacity,
                          observer=Watch())
    assert beside, "no training layout beside a replica"
    assert len(res.jct) == len(jobs)
    assert run.dropped == 0
    assert {r.service for r in run.replicas} == {"qa", "vision"}


def test_sim__services_beside_whole_gpu_gangs():
    """Two-GPU jobs (the gang layer around ServicesFirst) beside services: the gang layer never
    holds a GPU whose slices replicas hold (a contract error), every job finishes."""
    import dataclasses

    from miso.sched.serviceplan import catalogue_capacity
    from miso.serving.traces import step_trace
    from miso.sim.servicecluster import run_shared
    from miso.sim.traces import poisson_jobs
    from miso.sim.world import WorldConfig

    span = 400.0
    svcs = [(SERVICES[0], step_trace(30.0, span, 100.0, 5.0, 150.0, seed=1)),
            (SERVICES[1], step_trace(100.0, span, 200.0, 3.0, None, seed=2))]
    jobs = [dataclasses.replace(j, num_gpus=2) if i % 4 == 0 else j
            for i, j in enumerate(poisson_jobs(12, seed=2, mean_interarrival_s=20.0))]
    run, res = run_shared(svcs, jobs, WorldConfig(n_gpus=4, restart_s=60.0), span, seed=2,
                          capacity=catalogue_capacity)
    assert len(res.jct) == len(jobs) and run.dropped == 0
