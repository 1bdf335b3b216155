"""Inference services through the scheduling core (issue 28): replicas in ClusterState, the
ServicesFirst policy through the one DriverStep, training in the slices replicas leave free,
replicas charged to their owner, the restart economy choosing where a replica goes."""

from __future__ import annotations

import random

import pytest

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
            assert running, f"stuck: {sorted(st.queue)} " + "\n".join(f"{t:.0f} {x}" for t, x in log[-40:])
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


def test_services_first__a_replica_goes_where_it_stops_the_least_training():
    """Two GPUs: g0 runs two jobs on 4g+3g, g1 one job on its whole GPU. A service needing a
    4g slice takes it from g1? No: from the GPU where it displaces least (one job either way,
    the smaller share: g0's 3g slot is too small, so g0's 4g job (4/7) vs g1's 7g job
    (7/7)): g0, and the displaced job is checkpointed before the replica starts."""
    pol = _policy()
    st = ClusterState()
    decided: list[object] = []
    step = DriverStep(st, pol, execute=lambda t, d, c: decided.append(d),
                      on_contract_error=lambda t, d, e: pytest.fail(str(e)))
    for g in ("g0", "g1"):
        step(0.0, GpuAdded(g, "A100-40GB"))
    for i, g in ((1, "g0"), (2, "g0"), (3, "g1")):
        step(0.0, JobSubmitted(JobSpec(str(i), "j", 4.0, "resnet_train64")))
    # force the layouts: g0 4g+3g, g1 whole
    gs0, gs1 = st.gpus["g0"], st.gpus["g1"]
    for d in list(decided):
        if isinstance(d, ApplyLayout | StartProfiling):
            step(1.0, LayoutApplied(d.gpu, d.plan_id) if isinstance(d, ApplyLayout) else
                 ProfilingFinished(d.gpu, d.plan_id, {j: (1.0, 0.8, 0.3) for j in d.jobs}))
    for _ in range(5):
        for d in list(decided):
            if isinstance(d, ApplyLayout) and st.gpus[d.gpu].pending is d:
                step(2.0, LayoutApplied(d.gpu, d.plan_id))
    assert not gs0.pending and not gs1.pending
    # a service that needs one 4g-sized replica (memory: llama2-7b needs a 20 GB slice)
    spec = ServiceSpec("chat", "alice", "llama2-7b", 10_000, min_replicas=1, headroom=0.0)
    decided.clear()
    step(3.0, ServiceSubmitted(spec))
    starts = [d for d in decided if isinstance(d, StartReplica)]
    assert len(starts) == 1
    d = starts[0]
    cost = pol.slot_cost
    assert all(cost(d.gpu, d.slot) <= cost(g, Placement(s, d.profile))
               for g in ("g0", "g1") for s in geometry("A100-40GB").model.profile(
                   d.profile).starts
               if is_valid(st.gpus[g].base or st.gpus[g].geom,
                           [*st.services.slots(g), Placement(s, d.profile)]))
    requeued = [x.job for x in decided if isinstance(x, RequeueJob)]
    i_start = decided.index(d)
    assert all(decided.index(x) < i_start for x in decided if isinstance(x, RequeueJob))
    assert set(requeued) <= set(st.jobs)
