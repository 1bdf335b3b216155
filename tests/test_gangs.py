"""Gangs (jobs on several whole GPUs): all or nothing, reservation, backfill (miso.sched.gangs)."""

from __future__ import annotations

import random

import pytest

from miso.mig import Placement
from miso.sched import ClusterState, ContractError, GpuAdded, JobSpec, JobSubmitted, make_policy
from miso.sched.decisions import HoldGpu, StartGang
from miso.sched.events import GangStarted
from miso.sched.gangs import GangLayer, pick_gpus
from miso.sched.speeds import workload_memory_gb
from miso.sim.engine import Simulator
from miso.sim.run import build_policy, optsta_candidates
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


def _stream(n: int, seed: int, gpus: int) -> list[TraceJob]:
    rng = random.Random(seed)
    wls = ["resnet_train64", "bert_train4", "transformer_train32", "embedding_train128"]
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(1 / 120.0)
        k = rng.choice([1, 1, 1, 1, 2, 4, gpus // 2])
        out.append(TraceJob(str(i), t, rng.uniform(200, 3000), rng.choice(wls), num_gpus=k))
    return out


class Checker:
    """An observer that checks the gang invariants after every applied decision."""

    def __init__(self, layer: GangLayer) -> None:
        self.layer = layer
        self.started: dict[str, float] = {}
        self.promised: dict[str, float] = {}

    def on_event(self, now, ev, st) -> None:  # noqa: ANN001
        pass

    def on_decision(self, now, d, st: ClusterState) -> None:  # noqa: ANN001
        book = st.gangs
        seen: set[str] = set()
        for j, gpus in book.runs.items():
            assert len(gpus) == st.jobs[j].spec.num_gpus            # all its GPUs ...
            assert not seen & set(gpus)                             # ... no GPU twice
            seen |= set(gpus)
            for g in gpus:
                assert g in book.gpus and j in book.gpus[g].jobs and len(book.gpus[g].jobs) == 1
        for gs in st.gpus.values():                                 # the policies' view
            assert not any(j in book.runs for j in gs.jobs)
        for j in book.queue:
            assert st.jobs[j].gpu is None
        if isinstance(d, StartGang) and d.job not in self.started:
            self.started[d.job] = now
        res = self.layer.reservation
        if res is not None:
            head, t = res
            self.promised[head] = min(self.promised.get(head, float("inf")), t)


@pytest.mark.parametrize("policy", ["nopart", "optsta", "miso", "miso+"])
def test_gangs__all_or_nothing_and_reservations_kept_on_random_streams(policy):
    cfg = WorldConfig(n_gpus=8, reconfig_s=4.0)
    for seed in (1, 2):
        jobs = _stream(60, seed, 8)
        pol = make_policy("optsta", layout=optsta_candidates("A100-40GB")[3]) \
            if policy == "optsta" else build_policy(policy, jobs, cfg, seed)
        layer = GangLayer(pol,
                          node_of=lambda g: str(int(g[3:]) // 4))
        chk = Checker(layer)
        res = Simulator(layer, jobs, cfg, seed=seed, observer=chk, record=True).run()
        assert len(res.finish) == 60
        gangs = [j.id for j in jobs if j.num_gpus > 1]
        assert gangs and all(j in chk.started for j in gangs)
        assert chk.promised
        assert any(isinstance(d, StartGang) and d.why["trigger"] == "backfill"
                   for _, d in res.log) or seed == 1
        # backfill never delays a reservation: a gang starts by its promised time
        # (+ one reconfiguration)
        for j, t in chk.promised.items():
            assert chk.started[j] <= t + cfg.reconfig_s + 1e-6, (policy, seed, j)


def test_backfill__short_job_fills_the_reservation_long_one_waits():
    wl = "resnet_train64"
    jobs = [TraceJob("long", 0.0, 1000.0, wl), TraceJob("gang", 1.0, 500.0, wl, num_gpus=4),
            TraceJob("short", 2.0, 400.0, wl), TraceJob("big", 3.0, 5000.0, wl)]
    cfg = WorldConfig(n_gpus=4, reconfig_s=0.0, restart_s=0.0)
    r = Simulator(make_policy("nopart"), jobs, cfg, record=True).run()
    start = dict(zip(r.job_ids, r.first_start, strict=True))
    fin = dict(zip(r.job_ids, r.finish, strict=True))
    assert start["gang"] == pytest.approx(1000.0)       # as soon as "long" ends
    assert start["short"] == pytest.approx(2.0)         # backfilled (ends at 402 < 1000)
    assert fin["short"] < start["gang"]
    assert start["big"] >= fin["gang"] - 1e-6           # would have delayed the gang
    held = [d for _, d in r.log if isinstance(d, HoldGpu)]
    assert {d.gpu for d in held} == {"gpu0", "gpu1", "gpu2", "gpu3"}


def test_state__start_gang_is_all_or_nothing():
    st = ClusterState()
    for i in range(3):
        st.observe(0.0, GpuAdded(f"g{i}", "A100-40GB"))
    spec = JobSpec("a", "a", workload_memory_gb("resnet_train64"), num_gpus=2)
    st.observe(0.0, JobSubmitted(spec))
    assert st.queue == [] and st.gangs.queue == ["a"]
    st.apply(0.0, HoldGpu("g0", "a"))
    with pytest.raises(ContractError, match="not held"):      # g1 still in the policies' view
        st.apply(0.0, StartGang("a", ("g0", "g1"), st.new_plan_id()))
    with pytest.raises(ContractError, match="distinct GPUs"):
        st.apply(0.0, StartGang("a", ("g0",), st.new_plan_id()))
    assert st.jobs["a"].gpu is None and not st.gangs.runs    # nothing happened
    st.apply(0.0, HoldGpu("g1", "a"))
    pid = st.new_plan_id()
    st.apply(0.0, StartGang("a", ("g0", "g1"), pid))
    st.observe(1.0, GangStarted("a", pid))
    assert st.jobs["a"].status.value == "running"
    assert st.gangs.gpus["g1"].assignment == {"a": Placement(0, "7g.40gb")}
    # a lost GPU requeues the whole gang; the other GPU stays held and idle
    from miso.sched import GpuRemoved

    st.observe(2.0, GpuRemoved("g1"))
    assert st.gangs.queue == ["a"] and not st.gangs.runs and st.gangs.idle("g0")
    assert st.jobs["a"].restarts == 1


def test_pick_gpus__fewest_nodes_or_the_nodes_asked():
    pool = ["a/0", "b/0", "b/1", "c/0", "c/1", "c/2"]
    node = lambda g: g.split("/")[0]  # noqa: E731
    assert pick_gpus(pool, 3, None, node) == ["c/0", "c/1", "c/2"]
    assert sorted(pick_gpus(pool, 4, 2, node)) == ["b/0", "b/1", "c/0", "c/1"]
    assert pick_gpus(pool, 4, 4, node) is None
    assert pick_gpus(pool, 7, None, node) is None


# -- several GPU models ---------------------------------------------------------------------


@pytest.mark.parametrize("aware", [True, False])
def test_two_models__each_job_where_it_gains_most_hand_computed(aware):
    # Hand-computed (sched/modelspeed.py): h(H100-80GB) = sqrt(989/312 * 3350/1555) = 2.6132.
    # deepspeech2_train8 runs at 0.1181 on a 1g A100 slice: p = (1/0.1181 - 1)/6 > 1 -> 1, so
    # f = 2.6132; mobilenet_train64 at 0.8101: p = (1/0.8101 - 1)/6 = 0.03907,
    # f = 1 / (0.96093 + 0.03907/2.6132) = 1.0247. The first prefers the H100, the second the
    # A100; blind placement gives the first job the first GPU (the A100).
    from miso.sched.modelspeed import model_factor

    assert model_factor("deepspeech2_train8", "H100-80GB") == pytest.approx(2.6132, abs=1e-4)
    assert model_factor("mobilenet_train64", "H100-80GB") == pytest.approx(1.0247, abs=1e-4)
    jobs = [TraceJob("a", 0.0, 1000.0, "deepspeech2_train8"),
            TraceJob("b", 0.0, 1000.0, "mobilenet_train64")]
    cfg = WorldConfig(gpu_mix=(("A100-40GB", 1), ("H100-80GB", 1)), n_gpus=2, reconfig_s=0.0,
                      restart_s=0.0, predictor="true")
    from miso.sched import PlaceJob
    from miso.sim.run import run_policy

    r = run_policy("miso", jobs, cfg, 1, record=True, model_aware=aware)
    where = {d.job: d.gpu for _, d in r.log if isinstance(d, PlaceJob)}
    jct = dict(zip(r.job_ids, r.jct, strict=True))
    if aware:
        assert where == {"a": "gpu1", "b": "gpu0"}
        assert jct["a"] == pytest.approx(1000.0 / 2.6132, rel=1e-4)
        assert jct["b"] == pytest.approx(1000.0, rel=1e-6)
    else:
        assert where == {"a": "gpu0", "b": "gpu1"}
        assert jct["a"] == pytest.approx(1000.0, rel=1e-6)
        assert jct["b"] == pytest.approx(1000.0 / 1.0247, rel=1e-4)


def test_tenancy__charges_gangs_n_gpus_and_other_models_by_hardware_ratio():
    from miso.sched.tenancyconfig import TenancyConfig

    st = ClusterState(tenancy=TenancyConfig())
    st.observe(0.0, GpuAdded("a0", "A100-40GB"))
    st.observe(0.0, GpuAdded("h0", "H100-80GB"))
    st.observe(0.0, GpuAdded("h1", "H100-80GB"))
    mem = workload_memory_gb("resnet_train64")
    st.observe(0.0, JobSubmitted(JobSpec("g", "g", mem, owner="u1", num_gpus=2)))
    for g in ("h0", "h1"):
        st.apply(0.0, HoldGpu(g, "g"))
    st.apply(0.0, StartGang("g", ("h0", "h1"), st.new_plan_id()))
    ten = st.tenancy
    assert ten is not None
    # two whole H100-80GB GPUs in A100-40GB GPU-equivalents: 2 x sqrt(989/312 x 3350/1555)
    assert ten.in_use["u1"] == pytest.approx(2 * 2.6132, abs=1e-3)


def test_gangs__cancel_and_lost_gpu_end_or_requeue_the_whole_gang():
    from miso.sched import GpuRemoved, JobFailed

    jobs = _stream(40, 3, 8)
    cfg = WorldConfig(n_gpus=8)

    def sim_of() -> tuple[Simulator, Checker]:
        layer = GangLayer(make_policy("nopart"))
        chk = Checker(layer)
        return Simulator(layer, jobs, cfg, seed=3, observer=chk, record=True), chk

    dry, _ = sim_of()
    r0 = dry.run()
    fin0 = dict(zip(r0.job_ids, r0.finish, strict=True))
    t, d = next((t, d) for t, d in r0.log if isinstance(d, StartGang) and len(d.gpus) > 1
                and fin0[d.job] > t + 20)
    cancelled = next(j.id for j in jobs if j.num_gpus > 1 and j.id != d.job)
    sim, chk = sim_of()
    sub = next(j.submit_s for j in jobs if j.id == cancelled)
    sim.inject(sub + 1.0, JobFailed(cancelled, "cancelled"))
    sim.inject(t + 10.0, GpuRemoved(d.gpus[-1]))          # a GPU of a running gang
    r = sim.run()
    fin = dict(zip(r.job_ids, r.finish, strict=True))
    assert fin[cancelled] == pytest.approx(sub + 1.0)
    k = r.job_ids.index(d.job)
    assert r.restarts[k] >= 1 and fin[d.job] > fin0[d.job]  # requeued whole, ran again
    assert d.gpus[-1] not in sim.state.gpus and d.gpus[-1] not in sim.state.gangs.gpus
    assert not sim.state.gangs.runs and not sim.state.gangs.queue


# -- the job helper in a gang ---------------------------------------------------------------


def test_job_helper__only_rank_zero_writes_every_rank_resumes(tmp_path):
    import json

    from miso.job import JobContext

    ck = tmp_path / "ck"
    resume = tmp_path / "resume.json"
    resume.write_text(json.dumps({"iteration": 7}))

    def ctx(rank: int) -> JobContext:
        env = {"MISO_JOB_ID": "g", "MISO_PROGRESS_FILE": str(tmp_path / f"p{rank}.json"),
               "MISO_CHECKPOINT_DIR": str(ck), "MISO_RESUME_FROM": str(resume),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        return JobContext(env, install_signal=False)

    r0, r1 = ctx(0), ctx(1)
    assert (r0.writer, r1.writer, r1.world_size) == (True, False, 2)
    assert r0.load() == r1.load() == {"iteration": 7}
    for c in (r1, r0):
        c.started(7, 10)
        c.report(8, 10, force=True)
    assert r1.save_json({"iteration": 8}, iteration=8) is None
    assert not (ck / "checkpoint.json").exists()           # rank 1 wrote nothing
    assert r0.save_json({"iteration": 8}, iteration=8) == str(ck / "checkpoint.json")
    assert not (tmp_path / "p1.json").exists()
    assert json.loads((tmp_path / "p0.json").read_text())["checkpoint"]["iteration"] == 8



def test_optsta__a_best_static_layout_per_gpu_model():
    cfg = WorldConfig(n_gpus=4, gpu_mix=(("A100-40GB", 2), ("H100-80GB", 2)))
    jobs = [j for j in _stream(60, 3, 4) if j.num_gpus == 1]
    pol = build_policy("optsta", jobs, cfg, 1)
    lays = pol.by_model
    assert set(lays) == {"A100-40GB", "H100-80GB"}
    for m, lay in lays.items():
        assert lay in optsta_candidates(m)  # a layout of that model's geometry
    r = Simulator(pol, jobs, cfg, seed=1, record=True).run()
    assert len(r.jct) == len(jobs) and (r.jct > 0).all()
    applied = {d.gpu: tuple(sorted(d.layout)) for _, d in r.log
               if type(d).__name__ == "ApplyLayout"}
    model = {f"gpu{i}": m for i, m in enumerate(["A100-40GB"] * 2 + ["H100-80GB"] * 2)}
    assert set(applied) == set(model)
    assert all(lay == lays[model[g]] for g, lay in applied.items())


def test_reservation__counts_a_gang_run_ending_soon_and_drains_nothing():
    """Slurm counts every running job's end: a 2-GPU gang waiting behind a 2-GPU run that ends
    at 500 s takes that run's GPUs then; the GPUs of one-GPU jobs ending at 3,000 s are never
    held for it (before, both were held at 10 s and drained until the run ended)."""
    wl = "resnet_train64"
    jobs = [TraceJob("a", 0.0, 3000.0, wl), TraceJob("b", 0.0, 3000.0, wl),
            TraceJob("run", 0.0, 500.0, wl, num_gpus=2),
            TraceJob("gang", 10.0, 500.0, wl, num_gpus=2),
            TraceJob("c", 20.0, 400.0, wl), TraceJob("d", 20.0, 400.0, wl)]
    cfg = WorldConfig(n_gpus=4, reconfig_s=0.0, restart_s=0.0)
    r = Simulator(make_policy("nopart"), jobs, cfg, record=True).run()
    start = dict(zip(r.job_ids, r.first_start, strict=True))
    assert start["gang"] == pytest.approx(500.0)        # on "run"'s GPUs as it ends
    held_for_gang = {d.gpu for _, d in r.log if isinstance(d, HoldGpu) and d.job == "gang"}
    assert not held_for_gang                            # no GPU of "a" or "b" drained
