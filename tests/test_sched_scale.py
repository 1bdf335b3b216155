"""Scale: the occupancy index, and policies that use it decide exactly as the GPU scans did.

The reference policies below keep the scanning code the index replaced (every GPU looked at per
placement). Each indexed policy and its reference get identical event streams (random streams
with GPU churn and failures, and simulator runs) and must return identical decisions.
"""

from __future__ import annotations

import random

import pytest

from miso.mig import Placement, geometry
from miso.sched import (
    ApplyLayout,
    ClusterState,
    GpuAdded,
    GpuRemoved,
    JobFinished,
    JobSpec,
    JobSpeedChanged,
    JobSubmitted,
    LayoutApplied,
    LayoutFailed,
    NoisyOracle,
    PlaceJob,
    ProfilingFinished,
    RunMps,
    StartProfiling,
    TrueSpeeds,
)
from miso.sched.decisions import Decision, RequeueCause
from miso.sched.occupancy import Occupancy
from miso.sched.policies.base import (
    Scratch,
    fit_classes,
    fitting_profiles,
    mix_feasible,
)
from miso.sched.policies.baselines import BACKFILL_WINDOW, MpsOnly, NoPart, OptSta
from miso.sched.policies.miso import Miso
from miso.sched.policies.misoplus import MisoPlus
from miso.sched.policies.rebalance import Rebalancing
from miso.sched.speeds import workload_memory_gb
from miso.sim.engine import Simulator
from miso.sim.traces import poisson_jobs
from miso.sim.world import WorldConfig
from miso.workloads import catalogue

# -- reference implementations: the pre-index scans ------------------------------------------


class RefNoPart(NoPart):
    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        free = [g for g in st.gpus if not sc.jobs_on(g)]
        if not free:
            return
        fi = 0
        for j in sc.queue()[:BACKFILL_WINDOW]:
            if fi >= len(free):
                break
            gs = st.gpus[free[fi]]
            full = gs.geom.model.full_profile()
            if full.memory_gib + 1e-9 < st.jobs[j].spec.memory_gb:
                continue
            pl = Placement(0, full.name)
            sc.place(j, gs.id)
            sc.out.append(ApplyLayout(gs.id, st.new_plan_id(), (pl,), {j: pl}))
            fi += 1


class RefOptSta(OptSta):
    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        queue = sc.queue()[:BACKFILL_WINDOW]
        if not queue:
            return
        free: dict[str, list[Placement]] = {}
        order: dict[str, int] = {}
        for gi, g in enumerate(st.gpus):
            f = self._free(sc, g, self._asg(sc, g))
            if f:
                free[g] = f
                order[g] = gi
        if not free:
            return
        new_asg: dict[str, dict[str, Placement]] = {}
        for j in queue:
            if not free:
                break
            mem = st.jobs[j].spec.memory_gb
            best: tuple[tuple[int, int, int], str, Placement] | None = None
            for g, insts in free.items():
                gs = st.gpus[g]
                fits = fitting_profiles(gs.geom, mem)
                n = len(new_asg.get(g) or self._asg(sc, g))
                for pl in insts:
                    if pl.profile not in fits:
                        continue
                    key = (-gs.geom.model.profile(pl.profile).compute_slices, n, order[g])
                    if best is None or key < best[0]:
                        best = (key, g, pl)
            if best is None:
                continue
            _, g, pl = best
            sc.place(j, g)
            asg = dict(new_asg.get(g) or self._asg(sc, g))
            asg[j] = pl
            new_asg[g] = asg
            free[g].remove(pl)
            if not free[g]:
                del free[g]
        for g, asg in new_asg.items():
            sc.out.append(ApplyLayout(g, st.new_plan_id(), self._layout(sc, g), asg))


class RefMps(MpsOnly):
    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        share = 100 // self.slots
        touched: list[str] = []
        order = {g: i for i, g in enumerate(st.gpus)}
        for j in sc.queue()[:BACKFILL_WINDOW]:
            mem = st.jobs[j].spec.memory_gb
            best = None
            for g, gs in st.gpus.items():
                n = len(sc.jobs_on(g))
                if n >= self.slots:
                    continue
                cap = gs.geom.model.full_profile().memory_gib
                if sc.memory_on(g) + mem > cap + 1e-9:
                    continue
                key = (n, order[g])
                if best is None or key < best[0]:
                    best = (key, g)
            if best is None:
                continue
            g = best[1]
            sc.place(j, g)
            if g not in touched:
                touched.append(g)
        for g in touched:
            sc.out.append(RunMps(g, st.new_plan_id(), dict.fromkeys(sc.jobs_on(g), share)))


def _levels(sc: Scratch) -> list[list[str]]:
    buckets: list[list[str]] = [[] for _ in range(8)]
    for g in sc.state.gpus:
        buckets[min(len(sc.jobs_on(g)), 7)].append(g)
    return buckets


class RefMiso(Miso):
    def choose_gpu(self, now: float, job: str, sc: Scratch) -> str | None:
        st = sc.state
        mem = st.jobs[job].spec.memory_gb
        for n, bucket in enumerate(_levels(sc)):
            for g in bucket:
                gs = st.gpus[g]
                if n >= min(self.max_jobs, gs.geom.model.max_instances):
                    continue
                mems = [st.jobs[j].spec.memory_gb for j in sc.jobs_on(g)] + [mem]
                if mix_feasible(gs.geom, mems):
                    return g
        return None


def _scan_candidates(pol: Miso, sc: Scratch, job: str):
    st = sc.state
    mem = st.jobs[job].spec.memory_gb
    for n, bucket in enumerate(_levels(sc)):
        for g in bucket:
            gs = st.gpus[g]
            if n >= min(pol.max_jobs, gs.geom.model.max_instances):
                continue
            mems = [st.jobs[j].spec.memory_gb for j in sc.jobs_on(g)] + [mem]
            if mix_feasible(gs.geom, mems):
                yield n, g


class _RefRebalancing(Rebalancing):
    def fill_idle_gpus(self, now: float, sc: Scratch) -> None:
        self.pol.ref_fill_idle_gpus(now, sc)  # type: ignore[attr-defined]


class RefMisoPlus(MisoPlus):
    """miso+ with the scans: candidates over every GPU, donors over every GPU per completion."""

    def candidate_gpus(self, sc, job):  # type: ignore[override]
        return _scan_candidates(self, sc, job)

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.rebalancer = _RefRebalancing(self)  # (no options of its own)

    def ref_fill_idle_gpus(self, now: float, sc: Scratch) -> None:
        st = sc.state
        if sc.queue():
            return
        idle = [g for g, gs in st.gpus.items() if not gs.busy and not sc.jobs_on(g)]
        if not idle:
            return
        donors: list[tuple[float, str, str]] = []
        for g, gs in st.gpus.items():
            jobs = sc.jobs_on(g)
            if len(jobs) < 2 or gs.busy:
                continue
            pinned = self.pinned(sc, jobs)
            for j in jobs:
                pl = gs.assignment.get(j)
                if pl is None or j in pinned:
                    continue
                s = self.speeds(gs.geom, sc, [j])[j].get(pl.profile, 1.0)
                w = self.work.remaining(st, j)
                c = self.restarts.cost(j)  # the one restart price, learned per job
                saved = w / max(s, 0.05) - w - c
                if saved > c:
                    donors.append((-saved, j, g))
        donors.sort()
        used: set[str] = set()
        for target in idle:
            while donors and donors[0][2] in used:
                donors.pop(0)
            if not donors:
                return
            saved, j, src = donors.pop(0)
            used.add(src)
            sc.requeue(j, f"rebalance to idle {target}", cause=RequeueCause.REBALANCE)
            sc.place(j, target)
            full = Placement(0, st.gpus[target].geom.model.full_profile().name)
            sc.out.append(ApplyLayout(target, st.new_plan_id(), (full,), {j: full}, why={
                "trigger": "rebalance", "restarts": [j], "expected_gain": -saved,
                "note": f"{target} is idle and nothing queues: {j} moves from {src} to the "
                        f"whole GPU, finishing ~{-saved:.0f} s sooner net of one restart"}))
            self.replan(now, src, sc)


OPTSTA_LAYOUT = (Placement(0, "4g.20gb"), Placement(4, "2g.10gb"), Placement(6, "1g.5gb"))


def _pair(name: str, **kw: object) -> tuple[object, object]:
    if name == "nopart":
        return NoPart(), RefNoPart()
    if name == "optsta":
        return OptSta(layout=OPTSTA_LAYOUT), RefOptSta(layout=OPTSTA_LAYOUT)
    if name == "mps":
        return MpsOnly(), RefMps()
    # the pre-index scans place in GPU order: compare the index with model-aware placement
    # off (it is tested on its own in tests/test_gangs.py)
    kw.setdefault("model_aware", False)
    if name == "oracle":
        return Miso(estimator=TrueSpeeds(), **kw), RefMiso(estimator=TrueSpeeds(), **kw)
    if name == "miso+":
        return MisoPlus(estimator=NoisyOracle(), **kw), RefMisoPlus(estimator=NoisyOracle(), **kw)
    assert name == "miso"
    return Miso(estimator=NoisyOracle(), **kw), RefMiso(estimator=NoisyOracle(), **kw)


POLICIES = ["nopart", "optsta", "mps", "oracle", "miso", "miso+"]

# -- random streams with churn ---------------------------------------------------------------


def _differential(name: str, seed: int, steps: int = 500) -> int:
    """Drive an indexed policy and its reference with one random event stream (arrivals,
    finishes, acks, failed layouts, profiles, speed changes, GPUs removed and re-added, two GPU
    models) and assert identical decisions at every step. Returns the decisions compared."""
    rng = random.Random(seed)
    names = sorted(catalogue())
    kw = {"max_jobs_per_gpu": 4} if seed % 2 else {}
    pols = _pair(name, **kw)
    states = (ClusterState(), ClusterState())
    pending: list[Decision] = []
    now = 0.0
    compared = 0

    def deliver(ev: object) -> None:
        nonlocal compared
        outs = []
        for pol, st in zip(pols, states, strict=True):
            st.observe(now, ev)  # type: ignore[arg-type]
            out = pol.decide(now, ev, st)  # type: ignore[attr-defined]
            for d in out:
                st.apply(now, d)
            outs.append(out)
        assert repr(outs[0]) == repr(outs[1]), f"step at t={now:.1f}, event {ev!r}"
        compared += len(outs[0])
        pending.extend(d for d in outs[0] if isinstance(d, (ApplyLayout, StartProfiling,
                                                            RunMps)))

    models = ["A100-40GB", "A100-40GB", "A30-24GB"] if name != "optsta" else ["A100-40GB"]
    for i in range(6):
        deliver(GpuAdded(f"g{i}", models[i % len(models)]))
    st = states[0]
    submitted = 0
    for _ in range(steps):
        now += rng.random() * 10
        r = rng.random()
        if r < 0.32:
            wl = names[rng.randrange(len(names))]
            deliver(JobSubmitted(JobSpec(str(submitted), "x", workload_memory_gb(wl), wl)))
            submitted += 1
        elif r < 0.62 and pending:
            d = pending.pop(rng.randrange(len(pending)))
            if isinstance(d, StartProfiling):
                deliver(ProfilingFinished(d.gpu, d.plan_id, {j: (1.0, 0.8, 0.3) for j in d.jobs}))
            elif rng.random() < 0.05:
                deliver(LayoutFailed(d.gpu, d.plan_id, "injected"))  # type: ignore[attr-defined]
            else:
                deliver(LayoutApplied(d.gpu, d.plan_id))  # type: ignore[attr-defined]
        elif r < 0.9:
            running = [j for gs in st.gpus.values() for j in gs.jobs]
            if running:
                deliver(JobFinished(rng.choice(running)))
        elif r < 0.95:
            running = [(j, g) for g, gs in st.gpus.items() for j in gs.jobs]
            if running:
                j, g = rng.choice(running)
                deliver(JobSpeedChanged(j, g, 0.5, 1.0))
        elif r < 0.975 and len(st.gpus) > 2:
            deliver(GpuRemoved(rng.choice(sorted(st.gpus))))
        else:
            gone = [f"g{i}" for i in range(8) if f"g{i}" not in st.gpus]
            if gone:
                g = rng.choice(gone)
                deliver(GpuAdded(g, models[int(g[1:]) % len(models)]))
    return compared


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_indexed_policy__decides_like_the_gpu_scan_on_random_streams(name: str, seed: int):
    assert _differential(name, seed) > 50


# -- simulator runs -------------------------------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_indexed_policy__simulator_log_equals_the_gpu_scan(name: str):
    """Light, saturated and overloaded clusters, with phase changes (re-profiling) and jobs
    that cannot checkpoint (pinned)."""
    for gpus, iat, prob, nock in [(12, 40.0, 0.0, 0.0), (6, 30.0, 0.3, 0.0), (4, 8.0, 0.0, 0.0),
                                  (8, 25.0, 0.0, 0.5)]:
        jobs = poisson_jobs(150, seed=gpus, mean_interarrival_s=iat)
        cfg = WorldConfig(n_gpus=gpus, phase_change_prob=prob, no_checkpoint_frac=nock)
        logs = []
        for pol in _pair(name):
            sim = Simulator(pol, jobs, cfg, seed=3, record=True)  # type: ignore[arg-type]
            r = sim.run()
            logs.append(repr(r.log))
        assert logs[0] == logs[1], (gpus, iat)


# -- the index itself ------------------------------------------------------------------------


class _View:
    def __init__(self, st: ClusterState) -> None:
        self.state = st
        self.touched: list[str] = []


def test_occupancy__classes_keep_gpu_order_through_changes_and_readding():
    st = ClusterState()
    for g in ("a", "b", "c", "d"):
        st.observe(0.0, GpuAdded(g, "A100-40GB"))
    occ = Occupancy(lambda v, g: len(v.state.gpus[g].jobs), lambda c: [("n", c)])
    v = _View(st)
    assert occ.view(v).members(0) == ["a", "b", "c", "d"]
    st.observe(0.0, JobSubmitted(JobSpec("1", "x", 1.0)))
    st.apply(0.0, PlaceJob("1", "b"))
    v = _View(st)
    assert occ.view(v).members(0) == ["a", "c", "d"]
    assert occ.members(1) == ["b"]
    assert occ.first([("n", 0), ("n", 1)]) == "a"
    assert list(occ.ordered([("n", 1), ("n", 0)])) == ["a", "b", "c", "d"]
    st.observe(1.0, GpuRemoved("a"))
    st.observe(1.0, GpuAdded("a", "A100-40GB"))  # back, last in GPU order
    v = _View(st)
    assert occ.view(v).members(0) == ["c", "d", "a"]
    assert occ.rank("a") > occ.rank("d")
    # A touch in the current call re-keys at once, from the view.
    v.touched.append("c")
    occ2 = Occupancy(lambda vv, g: (len(vv.state.gpus[g].jobs) + (g in vv.touched)))
    assert occ2.view(v).members(1) == ["b", "c"]
    assert occ2.view(_View(st)).members(1) == ["b"]  # next call: the state again


def test_fit_classes__cover_every_memory_of_every_model():
    rng = random.Random(1)
    for model in ("A100-40GB", "A100-80GB", "A30-24GB", "H100-80GB"):
        geom = geometry(model)
        classes = set(fit_classes(geom))
        mems = [p.memory_gib for p in geom.profiles] + [rng.uniform(0, 100) for _ in range(300)]
        for m in mems:
            f = fitting_profiles(geom, m)
            assert not f or f in classes, (model, m)


# -- the optimizer's vectorised restart-aware choice -------------------------------------------


def _brute_kept(geom, speeds, current, pen, pinned):
    """(best restart-aware score, most jobs kept among the (near-)best) over all layouts and
    permutations."""
    import itertools

    from miso.mig import enumerate_layouts

    jobs = list(speeds)
    best: list[tuple[float, int]] = []
    for lay in enumerate_layouts(geom):
        if len(lay) != len(jobs):
            continue
        for perm in itertools.permutations(lay):
            asg = dict(zip(jobs, perm, strict=True))
            if any(pl.profile not in speeds[j] for j, pl in asg.items()):
                continue
            if any(asg[j] != current[j] for j in pinned):
                continue
            kept = [j for j in current if asg[j] == current[j]]
            score = sum(speeds[j][pl.profile] for j, pl in asg.items()) - sum(
                p for j, p in pen.items() if j not in kept)
            best.append((score, len(kept)))
    if not best:
        return None
    top = max(s for s, _ in best)
    return top, max(k for s, k in best if s >= top - 1e-9)


@pytest.mark.parametrize("model", ["A100-40GB", "A30-24GB"])
def test_optimizer__restart_aware_choice_keeps_most_jobs_among_the_best(model):
    from miso.mig import enumerate_layouts
    from miso.optimize import OptimizerError, optimizer_for

    rng = random.Random(7)
    geom = geometry(model)
    opt = optimizer_for(geom)
    names = [p.name for p in geom.profiles]
    lays = list(enumerate_layouts(geom))
    checked = 0
    for _ in range(120):
        lay = rng.choice(lays)
        n = rng.randint(1, min(4, opt.max_jobs))
        # Coarse speeds and penalties make exact ties common, so tie-breaks are exercised.
        speeds = {f"j{i}": {p: rng.choice([0.25, 0.5, 0.75, 1.0]) for p in names
                            if rng.random() < 0.8} for i in range(n)}
        current = {j: pl for j, pl in zip(speeds, lay, strict=False) if rng.random() < 0.7}
        pen = {j: rng.choice([0.0, 0.25, 0.5]) for j in current}
        pinned = {j for j in current if rng.random() < 0.2}
        ref = _brute_kept(geom, speeds, current, pen, pinned)
        try:
            sol = opt.solve(speeds, current=current, objective="restart-aware",
                            restart_penalty=pen, pinned=pinned)
        except OptimizerError:
            assert ref is None
            continue
        assert ref is not None
        assert sol.objective == pytest.approx(ref[0], abs=1e-9)
        assert len(sol.kept) == ref[1]
        checked += 1
    assert checked > 40


# -- lazy ranking and the rebalance index ----------------------------------------------------


def test_lazy_ranking__pops_in_key_order_evaluating_only_what_reaches_the_top():
    from miso.sched.ranking import LazyRanking

    keys = {i: float(i) for i in range(100)}
    calls: list[int] = []

    def evaluate(i: int) -> float | None:
        calls.append(i)
        return keys[i]

    r = LazyRanking(evaluate)
    for i in keys:
        r.changed(i)
    r.refresh(1)
    assert r.pop(1) == (0.0, 0)
    # Keys only grow: later rounds re-evaluate just the items that reach the top.
    for i in keys:
        keys[i] += 0.3 * (i % 3)
    calls.clear()
    r.refresh(2)
    assert [r.pop(2) for _ in range(3)] == [(1.3, 1), (2.6, 2), (3.0, 3)]
    assert len(calls) < 10
    # An item that improves is re-ranked once it is reported changed.
    keys[50] = -1.0
    r.refresh(3)
    assert r.pop(3)[1] == 4
    r.changed(50)
    r.refresh(4)
    assert r.pop(4) == (-1.0, 50)
    keys[60] = None  # type: ignore[assignment]
    r.changed(60)
    r.refresh(5)
    popped = [r.pop(5) for _ in range(100)]
    assert 60 not in [p[1] for p in popped if p is not None]


def _donor_index(best, price):  # noqa: ANN001, ANN202
    """miso+'s rebalancing stage driven through its index alone: each GPU's best donor from
    ``best(sc, gpu, measured)``, the shared restart price from ``price()``."""
    from types import SimpleNamespace

    from miso.sched.policies.rebalance import Rebalancing

    idx = Rebalancing(SimpleNamespace(restarts=SimpleNamespace(cost=lambda j: price())))
    idx.best_donor = best  # type: ignore[method-assign]
    return idx


def test_rebalance_index__sees_changes_from_state_events_and_owner():
    st = ClusterState()
    for g in ("a", "b", "c"):
        st.observe(0.0, GpuAdded(g, "A100-40GB"))
    for i, g in enumerate(("a", "a", "b")):
        st.observe(0.0, JobSubmitted(JobSpec(str(i), "x", 1.0)))
        st.apply(0.0, PlaceJob(str(i), g))
    value = {"a": -10.0, "b": -5.0, "c": None}
    idx = _donor_index(
        lambda sc, g, measured: None if value[g] is None or not measured else (value[g], "j" + g),
        lambda: 0.0)

    def pop(ev: object) -> list[str]:
        st.observe(0.0, ev)  # type: ignore[arg-type]
        idx.note(ev, st)  # type: ignore[arg-type]
        sc = Scratch(st)
        out = []
        while (got := idx.pop(sc)) is not None:
            out.append(got[2])
        return out

    assert pop(JobSubmitted(JobSpec("x1", "x", 1.0))) == ["a", "b"]
    value["c"] = -20.0
    assert pop(JobSubmitted(JobSpec("x2", "x", 1.0))) == []  # nothing reported c changed
    st.apply(0.0, PlaceJob("x1", "c"))                      # a state change on c
    assert pop(JobSubmitted(JobSpec("x3", "x", 1.0))) == ["c"]
    value["b"] = -30.0
    assert pop(SpeedObservedLike("b")) == ["b"]              # an event naming the GPU
    value["a"] = -1.0
    assert pop(JobSpeedChanged("1", "zz", 0.5, 1.0)) == ["a"]  # naming a job on it
    value["b"] = -2.0
    idx.changed("b")                                         # the owner says so
    assert pop(JobSubmitted(JobSpec("x4", "x", 1.0))) == ["b"]
    sc = Scratch(st)
    assert list(idx.idle(sc)) == []
    st.observe(1.0, JobFinished("2"))
    assert list(idx.idle(Scratch(st))) == ["b"]


def test_rebalance_index__prices_unmeasured_donors_at_the_shared_price_of_now():
    """Donors whose restart cost was not measured save their gain less the shared price, which
    moves with every measurement: when it falls, they rank by it without any GPU changing."""
    st = ClusterState()
    for g in ("a", "b", "c"):
        st.observe(0.0, GpuAdded(g, "A100-40GB"))
    gain = {"a": 100.0, "b": 50.0}   # unmeasured donors: gain before the restart
    measured = {"c": -70.0}          # a measured donor: -saving, its own cost counted
    price = [60.0]
    idx = _donor_index(
        lambda sc, g, m: ((measured[g], "m" + g) if g in measured else None) if m
        else ((-gain[g], "u" + g) if g in gain else None),
        lambda: price[0])

    def pop(name: str) -> list[tuple[float, str]]:
        ev = JobSubmitted(JobSpec(name, "x", 1.0))
        st.observe(0.0, ev)
        idx.note(ev, st)
        sc = Scratch(st)
        out = []
        while (got := idx.pop(sc)) is not None:
            out.append((got[0], got[2]))
        return out

    # At 60 s neither unmeasured donor saves more than a restart (40 s, -10 s).
    assert pop("y1") == [(-70.0, "c")]
    price[0] = 20.0  # measurements elsewhere lowered the shared price: both pay now
    assert pop("y2") == [(-80.0, "a"), (-30.0, "b")]


class SpeedObservedLike:
    """An event that names a GPU (as SpeedObserved, ProfilingFinished, LayoutApplied do)."""

    def __init__(self, gpu: str) -> None:
        self.gpu = gpu
