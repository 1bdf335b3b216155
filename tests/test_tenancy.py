"""Tenancy: usage in GPU-equivalents decayed by a half-life, fair-share order, quotas,
priorities with preemption (core, simulator)."""

from __future__ import annotations

import math

import pytest

from miso.mig import Placement
from miso.sched import (
    ApplyLayout,
    GpuAdded,
    JobFinished,
    JobSpec,
    JobSubmitted,
    LayoutApplied,
    PlaceJob,
    RequeueJob,
    make_policy,
)
from miso.sched.state import ClusterState
from miso.sched.tenancyconfig import TenancyConfig, parse_priority
from miso.sim.metrics import jain, summarize
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob, assign_tenants, load_trace, mark_priority, poisson_jobs
from miso.sim.world import WorldConfig

H = 100.0  # half-life of the hand-computed example (s)


def _submit(st: ClusterState, t: float, jid: str, owner: str, prio: int = 0) -> None:
    st.observe(t, JobSubmitted(JobSpec(jid, jid, 5.0, owner=owner, priority=prio)))


def _run_on(st: ClusterState, t: float, jid: str, gpu: str, pl: Placement) -> None:
    st.apply(t, PlaceJob(jid, gpu))
    pid = st.new_plan_id()
    st.apply(t, ApplyLayout(gpu, pid, (pl,), {jid: pl}))
    st.observe(t, LayoutApplied(gpu, pid))


def _two_owners() -> ClusterState:
    """a holds a whole A100 over [0, 100]; b holds a 3g slice (3/7 GPU) over [0, 200]; each
    has one job waiting, a's submitted first."""
    st = ClusterState(TenancyConfig(half_life_s=H))
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    st.observe(0.0, GpuAdded("g1", "A100-40GB"))
    _submit(st, 0.0, "a1", "a")
    _submit(st, 0.0, "b1", "b")
    _run_on(st, 0.0, "a1", "g0", Placement(0, "7g.40gb"))
    _run_on(st, 0.0, "b1", "g1", Placement(4, "3g.20gb"))
    _submit(st, 1.0, "a2", "a")
    _submit(st, 2.0, "b2", "b")
    st.observe(100.0, JobFinished("a1"))
    return st


def test_usage__hand_computed_decayed_gpu_equivalent_seconds():
    st = _two_owners()
    ten = st.tenancy
    assert ten is not None
    # charge c held over [0, T] decays to c * h/ln2 * (1 - 2^(-T/h)) at T
    k = H / math.log(2)
    assert ten.usage_at("a", 100.0) == pytest.approx(1.0 * k * 0.5)          # 72.13
    assert ten.usage_at("b", 100.0) == pytest.approx(3 / 7 * k * 0.5)        # 30.91
    assert ten.usage_at("a", 200.0) == pytest.approx(1.0 * k * 0.5 * 0.5)    # 36.07
    assert ten.usage_at("b", 200.0) == pytest.approx(3 / 7 * k * 0.75)       # 46.37
    assert ten.in_use == {"a": 0.0, "b": pytest.approx(3 / 7)}


def test_fair_share__order_follows_decayed_usage_not_submission():
    st = _two_owners()
    ten = st.tenancy
    assert ten is not None
    st.now = 100.0   # a used 72.1, b 30.9: b's job first though a's was submitted first
    assert ten.order(st.queue) == ["b2", "a2"]
    st.now = 200.0   # a's usage halved (36.1), b kept using (46.4): a first. Undecayed
    assert ten.order(st.queue) == ["a2", "b2"]  # usage (a 100, b 85.7) would keep b first
    assert ten.factor("a", 200.0) > ten.factor("b", 200.0)
    # Off: FIFO.
    st2 = _two_owners()
    st2.tenancy.config = TenancyConfig(fair_share=False, half_life_s=H)  # type: ignore[union-attr]
    st2.now = 100.0
    assert st2.tenancy.order(st2.queue) == ["a2", "b2"]  # type: ignore[union-attr]


def test_fair_share__a_policy_places_the_light_owner_first_fifo_within_an_owner():
    st = ClusterState(TenancyConfig(half_life_s=H))
    pol = make_policy("nopart")
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    # heavy owner h runs on g0 and queues two more; light owner l queues later
    for t, ev in [(0.0, JobSubmitted(JobSpec("h1", "h1", 5.0, owner="h"))),
                  (1.0, JobSubmitted(JobSpec("h2", "h2", 5.0, owner="h"))),
                  (2.0, JobSubmitted(JobSpec("h3", "h3", 5.0, owner="h"))),
                  (3.0, JobSubmitted(JobSpec("l1", "l1", 5.0, owner="l")))]:
        st.observe(t, ev)
        for d in pol.decide(t, ev, st):
            st.apply(t, d)
            if isinstance(d, ApplyLayout):
                st.observe(t, LayoutApplied(d.gpu, d.plan_id))
    assert st.jobs["h1"].gpu == "g0"
    ev = JobFinished("h1")
    st.observe(50.0, ev)
    placed = [d.job for d in pol.decide(50.0, ev, st) if isinstance(d, PlaceJob)]
    assert placed == ["l1"]
    assert st.tenancy.order(st.queue) == ["l1", "h2", "h3"]  # type: ignore[union-attr]


def test_quota__a_job_over_its_owners_in_use_quota_waits_and_says_why():
    st = ClusterState(TenancyConfig(max_in_use={"a": 1.0}))
    pol = make_policy("nopart")
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    st.observe(0.0, GpuAdded("g1", "A100-40GB"))
    st.observe(0.0, GpuAdded("g2", "A100-40GB"))
    placed: list[str] = []
    for i, (jid, owner) in enumerate([("a1", "a"), ("a2", "a"), ("b1", "b")]):
        ev = JobSubmitted(JobSpec(jid, jid, 5.0, owner=owner))
        st.observe(float(i), ev)
        for d in pol.decide(float(i), ev, st):
            st.apply(float(i), d)
            if isinstance(d, PlaceJob):
                placed.append(d.job)
            if isinstance(d, ApplyLayout):
                st.observe(float(i), LayoutApplied(d.gpu, d.plan_id))
    assert placed == ["a1", "b1"]      # a2 waits though g2 is free: a holds 1.0 of 1.0
    why = st.tenancy.why_waiting("a2")  # type: ignore[union-attr]
    assert why is not None and "quota" in why and "owner a" in why
    ev2 = JobFinished("a1")
    st.observe(10.0, ev2)
    assert [d.job for d in pol.decide(10.0, ev2, st) if isinstance(d, PlaceJob)] == ["a2"]


def test_quota__queued_quota_refuses_a_submission_with_a_reason():
    st = ClusterState(TenancyConfig(max_queued={"a": 2}))
    for i in range(2):
        _submit(st, float(i), f"a{i}", "a")
    assert st.tenancy.refuse_submit("b") is None  # type: ignore[union-attr]
    why = st.tenancy.refuse_submit("a")  # type: ignore[union-attr]
    assert why == "owner a already has 2 queued jobs (quota 2)"


def test_parse_priority():
    assert [parse_priority(x) for x in ("high", "Normal", "low", "7", 3)] == [100, 0, -100, 7, 3]
    for bad in ("urgent", 1.5, True):
        with pytest.raises(ValueError):
            parse_priority(bad)  # type: ignore[arg-type]


# -- preemption (simulated, NoPart: one job per GPU) ------------------------------------------
def _preempt_run(jobs: list[TraceJob], cfg: WorldConfig, **ten: object):
    # priority preemption alone (fair share's reclaim has its own tests)
    tc = TenancyConfig(preempt=True, min_run_s=600.0, reclaim=False,
                       **ten)  # type: ignore[arg-type]
    return run_policy("nopart", jobs, cfg, record=True, tenancy=tc)


def _requeued(r) -> list[str]:  # noqa: ANN001
    return [d.job for _, d in r.log if isinstance(d, RequeueJob)]


def test_preemption__high_job_preempts_the_cheapest_victim():
    # Two GPUs busy with normal jobs; x started at 0, y at 700 (both ran >= 600 s by 1400).
    jobs = [TraceJob("x", 0.0, 5000.0, "resnet_train64", "a"),
            TraceJob("y", 700.0, 5000.0, "resnet_train64", "a"),
            TraceJob("y0", 0.0, 600.0, "resnet_train64", "a"),
            TraceJob("h", 1400.0, 300.0, "resnet_train64", "b", 100)]
    # every job cannot checkpoint: only allowed by configuration, and the victim is the one
    # that loses the least work (y ran 700 s, x 1400 s)
    cfg = WorldConfig(n_gpus=2, no_checkpoint_frac=1.0)
    r = _preempt_run(jobs, cfg, preempt_uncheckpointable=True)
    assert _requeued(r) == ["y"]
    s = summarize(r)
    assert s["preemptions"] == 1
    jct = dict(zip(r.job_ids, r.jct, strict=True))
    assert jct["h"] == pytest.approx(300.0)   # started at once on y's GPU
    assert s["preempt_lost_gpu_s"] == pytest.approx(60.0 + 700.0)


def test_preemption__never_a_job_that_cannot_checkpoint_by_default():
    jobs = [TraceJob("x", 0.0, 5000.0, "resnet_train64", "a"),
            TraceJob("h", 1000.0, 300.0, "resnet_train64", "b", 100)]
    r = _preempt_run(jobs, WorldConfig(n_gpus=1, no_checkpoint_frac=1.0))
    assert _requeued(r) == []
    assert dict(zip(r.job_ids, r.jct, strict=True))["h"] == pytest.approx(4000.0 + 300.0)


def test_preemption__checkpointing_victim_not_before_its_minimum_run_time():
    jobs = [TraceJob("x", 0.0, 5000.0, "resnet_train64", "a"),
            TraceJob("h", 100.0, 300.0, "resnet_train64", "b", 100)]
    r = _preempt_run(jobs, WorldConfig(n_gpus=1))
    # x ran 100 s < 600 s when h came; the next decision point is x's end: no preemption
    assert _requeued(r) == []
    jobs2 = [TraceJob("x", 0.0, 5000.0, "resnet_train64", "a"),
             TraceJob("h", 1000.0, 300.0, "resnet_train64", "b", 100)]
    r2 = _preempt_run(jobs2, WorldConfig(n_gpus=1))
    assert _requeued(r2) == ["x"]
    jct = dict(zip(r2.job_ids, r2.jct, strict=True))
    assert jct["h"] == pytest.approx(300.0)
    # x resumed from its checkpoint: its 1000 s of work kept, one 60 s restart paid
    assert jct["x"] == pytest.approx(5000.0 + 300.0 + 60.0)


def test_preemption__equal_priority_never_preempts():
    jobs = [TraceJob("x", 0.0, 5000.0, "resnet_train64", "a", 100),
            TraceJob("h", 1000.0, 300.0, "resnet_train64", "b", 100)]
    assert _requeued(_preempt_run(jobs, WorldConfig(n_gpus=1))) == []


# -- simulator options ------------------------------------------------------------------------
def test_tenants__skew_gives_the_first_owner_its_fraction():
    jobs = assign_tenants(poisson_jobs(2000, seed=1), 3, 0.6, seed=1)
    share = [sum(j.owner == f"u{i}" for j in jobs) / len(jobs) for i in range(3)]
    assert share[0] == pytest.approx(0.6, abs=0.03)
    assert share[1] == pytest.approx(0.2, abs=0.03) and share[2] == pytest.approx(0.2, abs=0.03)
    hi = mark_priority(jobs, 0.1, seed=1)
    assert sum(j.priority == 100 for j in hi) / len(hi) == pytest.approx(0.1, abs=0.02)


def test_philly_owners_come_from_the_vc_column():
    jobs = load_trace("philly", max_jobs=200)
    assert all(j.owner for j in jobs) and len({j.owner for j in jobs}) > 3


def test_jain_index():
    assert jain([2.0, 2.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)


def test_sim__fair_share_cuts_the_light_owners_jct_and_reports_owners():
    jobs = assign_tenants(poisson_jobs(120, seed=2, mean_interarrival_s=60.0), 2, 0.8, seed=2)
    cfg = WorldConfig(n_gpus=4)
    off = summarize(run_policy("miso+", jobs, cfg, tenancy=TenancyConfig(fair_share=False)))
    on = summarize(run_policy("miso+", jobs, cfg, tenancy=TenancyConfig()))
    assert set(on["owners"]) == {"u0", "u1"}   # type: ignore[arg-type]
    shares = sum(v["gpu_share"] for v in on["owners"].values())  # type: ignore[union-attr]
    assert shares == pytest.approx(1.0)
    light_on = on["owners"]["u1"]["avg_jct_s"]   # type: ignore[index]
    light_off = off["owners"]["u1"]["avg_jct_s"]   # type: ignore[index]
    assert light_on < 0.8 * light_off
    assert 0.0 < on["jain_slowdown"] <= 1.0  # type: ignore[operator]


@pytest.mark.parametrize("name", ["nopart", "optsta", "mps", "miso+"])
def test_owners_without_fair_share__same_decisions_as_no_tenancy(name: str):
    """The ledger only watches: with fair share off, no quota and no priority, owners change
    no decision (the queue keeps its own order, ties included)."""
    from miso.sched import Decision

    base = poisson_jobs(60, seed=4, mean_interarrival_s=20.0)
    jobs = assign_tenants(base, 3, 0.5, seed=4)
    cfg = WorldConfig(n_gpus=3)
    kw = {"layout": (Placement(0, "4g.20gb"), Placement(4, "3g.20gb"))} \
        if name == "optsta" else {}
    a = run_policy(name, base, cfg, record=True, **kw)
    b = run_policy(name, jobs, cfg, record=True, tenancy=TenancyConfig(fair_share=False), **kw)
    da = [(t, repr(d)) for t, d in a.log if isinstance(d, Decision)]
    db = [(t, repr(d)) for t, d in b.log if isinstance(d, Decision)]
    assert da == db and len(da) > 50


def test_cli__tenant_options_json_and_owner_plot(tmp_path):
    import json

    import typer
    from typer.testing import CliRunner

    from miso.cli.simulate import simulate

    app = typer.Typer()
    app.command("simulate")(simulate)
    app.command("noop")(lambda: None)
    out = tmp_path / "o.json"
    r = CliRunner().invoke(app, [
        "simulate", "--gpus", "3", "--jobs", "40", "--mean-interarrival", "30",
        "--policies", "nopart,miso+", "--tenants", "3", "--tenant-skew", "0.6",
        "--fair-share", "--priority-frac", "0.2", "--preempt", "--json", str(out),
        "--plot-dir", str(tmp_path / "fig")])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    for s in d["policies"].values():
        assert set(s["owners"]) == {"u0", "u1", "u2"}
        assert set(s["owners"]["u0"]) >= {"avg_jct_s", "mean_slowdown", "gpu_share"}
        assert 0 < s["jain_slowdown"] <= 1
        assert set(s["priorities"]) == {"high", "normal"}
    assert (tmp_path / "fig" / "owner_share_misoplus.png").stat().st_size > 0
    bad = CliRunner().invoke(app, ["simulate", "--tenant-skew", "0.5"])
    assert bad.exit_code != 0 and "--tenants" in bad.output


# -- live controller (in-memory store, virtual clock, no agents) -------------------------------
class _Executor:
    def __init__(self) -> None:
        self.plans: list = []

    def submit(self, gpu: str, d: object) -> bool:
        self.plans.append((gpu, d))
        return True

    def remove_gpu(self, gpu: str) -> None:
        pass

    def busy(self) -> bool:
        return False


def _controller(ten: TenancyConfig, gpus: int):  # noqa: ANN202
    from miso.controller import Controller, ControllerConfig
    from miso.controller.runtime import GpuRef
    from miso.controller.store import JobStore
    from miso.mig import geometry
    from miso.sched.clock import VirtualClock

    con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                     ControllerConfig(policy="nopart", tenancy=ten, check_commands=False),
                     checkpoint_root="/nonexistent", clock=VirtualClock(),
                     policy=make_policy("nopart"))
    con.loop.executor = _Executor()  # type: ignore[assignment]
    for i in range(gpus):
        con.rt.gpus[f"g{i}"] = GpuRef(f"g{i}", "n0", i, "A100-40GB", geometry("A100-40GB"))
        con.loop.handle(("event", GpuAdded(f"g{i}", "A100-40GB")))
    return con


def _drain(con) -> None:  # noqa: ANN001
    while con.loop.run_once():
        pass


def test_live__queued_quota_refuses_a_submission_with_its_reason():
    from miso.controller.controller import SubmitError

    con = _controller(TenancyConfig(max_queued={"alice": 1}), gpus=0)
    con.submit(["train"], memory_gb=4.0, owner="alice")
    with pytest.raises(SubmitError, match=r"^owner alice already has 1 queued jobs \(quota 1\)$"):
        con.submit(["train"], memory_gb=4.0, owner="alice")
    con.submit(["train"], memory_gb=4.0, owner="bob")


def test_live__a_job_over_the_in_use_quota_waits_and_status_says_why():
    con = _controller(TenancyConfig(max_in_use={"alice": 1.0}), gpus=3)
    a1 = con.submit(["train"], memory_gb=4.0, owner="alice")
    a2 = con.submit(["train"], memory_gb=4.0, owner="alice")
    b1 = con.submit(["train"], memory_gb=4.0, owner="bob")
    _drain(con)
    jobs = {j["id"]: j for j in con.status()["jobs"]}
    st = con.loop.state
    assert st.jobs[a1].gpu is not None and st.jobs[b1].gpu is not None
    assert st.jobs[a2].gpu is None
    assert "quota" in jobs[a2]["why"] and "owner alice" in jobs[a2]["why"]
    assert con.cluster()["owners"]["alice"]["in_use"] == pytest.approx(1.0)



@pytest.mark.parametrize("name", ["nopart", "miso+"])
def test_fair_share__one_job_of_b_starts_at_the_first_completion_after_a_floods(name: str):
    """A submits 100 jobs onto a full cluster, then B submits 1: with fair share B's job
    takes the first slot that frees (FIFO would run it after A's 100)."""
    a = [TraceJob(f"a{i:03d}", float(i), 3000.0 + 10.0 * i, "resnet_train64", "A")
         for i in range(100)]
    b = TraceJob("b", 200.0, 600.0, "resnet_train64", "B")
    r = run_policy(name, [*a, b], WorldConfig(n_gpus=4), tenancy=TenancyConfig())
    start = dict(zip(r.job_ids, r.first_start, strict=True))
    fin = sorted(f for f in r.finish if f > b.submit_s)
    assert start["b"] <= fin[0] + 10.0   # reconfiguration of the freed slot: 4 s
    off = run_policy(name, [*a, b], WorldConfig(n_gpus=4),
                     tenancy=TenancyConfig(fair_share=False))
    assert dict(zip(off.job_ids, off.first_start, strict=True))["b"] > fin[5]


def test_live__per_owner_gauges_with_owner_labels_only():
    from prometheus_client.parser import text_string_to_metric_families

    from miso.observe import Metrics

    con = _controller(TenancyConfig(), gpus=1)
    con.submit(["train"], memory_gb=4.0, owner="alice")
    _drain(con)
    snap = con.status()
    text = Metrics(status=lambda: snap).render().decode()
    got = {(f.name, s.labels.get("owner")): s.value
           for f in text_string_to_metric_families(text) if f.name.startswith("miso_owner_")
           for s in f.samples}
    assert got[("miso_owner_gpu_equivalents", "alice")] == pytest.approx(1.0)
    assert got[("miso_owner_fair_share", "alice")] == pytest.approx(1.0)  # no time has passed
    for f in text_string_to_metric_families(text):
        if f.name.startswith("miso_owner_"):
            assert all(set(s.labels) == {"owner"} for s in f.samples)
