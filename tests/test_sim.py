"""Simulator: exact small cases, determinism, invariants over whole runs, traces, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from miso.mig import is_valid
from miso.sched import ApplyLayout, JobSpeedChanged, StartProfiling
from miso.sched.experiments import ToldRestartPrice
from miso.sim.engine import Simulator
from miso.sim.metrics import summarize
from miso.sim.run import ALL_POLICIES, build_policy, run_policy
from miso.sim.traces import TraceError, TraceJob, load_trace, poisson_jobs
from miso.sim.world import WorldConfig


def test_nopart__tiny_case_gives_hand_computed_jcts():
    jobs = [TraceJob("a", 0.0, 100.0, "resnet_train64"),
            TraceJob("b", 0.0, 200.0, "bert_train2"),
            TraceJob("c", 10.0, 50.0, "gnn_train128")]
    r = run_policy("nopart", jobs, WorldConfig(n_gpus=2), seed=1)
    jct = dict(zip(r.job_ids, r.jct, strict=True))
    # a on gpu0 [0,100], b on gpu1 [0,200], c waits for gpu0: [100,150] -> JCT 140.
    assert jct == pytest.approx({"a": 100.0, "b": 200.0, "c": 140.0})
    s = summarize(r)
    assert s["makespan_s"] == pytest.approx(200.0)
    assert s["stp"] == pytest.approx(1.0)
    assert s["restarts"] == 0


def test_mig_speed__a_job_alone_on_a_3g_slice_runs_at_its_table_speed():
    # OptSta with one 3g instance per GPU: a resnet job runs at its measured 3g speed.
    from miso.mig import Placement, geometry
    from miso.sched.speeds import workload_speeds
    from miso.workloads import catalogue

    lay = (Placement(0, "4g.20gb"), Placement(4, "3g.20gb"))
    jobs = [TraceJob("a", 0.0, 100.0, "resnet_train64"), TraceJob("b", 0.0, 100.0,
                                                                   "resnet_train64")]
    cfg = WorldConfig(n_gpus=1, reconfig_s=0.0)
    r = run_policy("optsta", jobs, cfg, seed=1, layout=lay, promote=False)
    sp = workload_speeds(geometry("A100-40GB"), catalogue()["resnet_train64"])
    assert sorted(r.jct) == pytest.approx(sorted([100 / sp["4g.20gb"], 100 / sp["3g.20gb"]]))


@pytest.fixture(scope="module")
def small_jobs() -> list[TraceJob]:
    return poisson_jobs(120, seed=3, mean_interarrival_s=20.0)


def test_runs_are_deterministic_per_seed(small_jobs):
    cfg = WorldConfig(n_gpus=6)
    a = summarize(run_policy("miso", small_jobs, cfg, seed=5))
    b = summarize(run_policy("miso", small_jobs, cfg, seed=5))
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    c = summarize(run_policy("miso", poisson_jobs(120, seed=4, mean_interarrival_s=20.0),
                             cfg, seed=4))
    assert c["avg_jct_s"] != a["avg_jct_s"]


@pytest.mark.parametrize("name", ALL_POLICIES)
def test_every_policy__finishes_all_jobs_with_valid_layouts_and_limits(name, small_jobs):
    cfg = WorldConfig(n_gpus=6, phase_change_prob=0.2)
    pol = build_policy(name, small_jobs, cfg, seed=2)
    sim = Simulator(pol, small_jobs, cfg, seed=2, record=True)
    r = sim.run()
    assert len(r.job_ids) == len(small_jobs)
    assert (r.finish >= r.submit + r.duration * 0.3).all()
    geom = sim.geom
    for _, item in r.log:
        if isinstance(item, ApplyLayout):
            assert is_valid(geom, item.layout)
    assert summarize(r)["stp"] > 0


def test_state_limits_never_exceeded_during_a_run(small_jobs):
    cfg = WorldConfig(n_gpus=2)  # crowded: up to 7 jobs per GPU and a queue
    pol = build_policy("miso", small_jobs, cfg, seed=1)
    sim = Simulator(pol, small_jobs, cfg, seed=1)
    orig = sim.deliver
    peak = [0]

    def checked(now, ev):
        orig(now, ev)
        for g, gs in sim.state.gpus.items():
            assert len(gs.jobs) <= 7
            assert sim.state.memory_used(g) <= 40.0
            peak[0] = max(peak[0], len(gs.jobs))

    sim.deliver = checked  # type: ignore[method-assign]
    sim.run()
    assert peak[0] == 7


def test_miso__reprofiles_after_a_speed_change():
    jobs = poisson_jobs(60, seed=1, mean_interarrival_s=30.0)
    cfg = WorldConfig(n_gpus=4, phase_change_prob=1.0)
    pol = build_policy("miso", jobs, cfg, seed=1, reprofile_cooldown_s=0.0,
                       speed_change_threshold=0.05)
    r = Simulator(pol, jobs, cfg, seed=1, record=True).run()
    changed = [(t, e) for t, e in r.log if isinstance(e, JobSpeedChanged)]
    assert changed
    t0, ev = changed[0]
    assert any(isinstance(d, StartProfiling) and t == t0 and ev.job in d.jobs
               for t, d in r.log)


def test_paper_setting__miso_beats_nopart_and_misoplus_beats_everyone():
    """At the paper's restart cost (30 s) MISO beats NoPart and is near Oracle; at the default
    honest cost (60 s, every MPS level switch a restart) miso+ beats NoPart, OptSta and MISO."""
    jobs = poisson_jobs(400, seed=1)
    paper = {p: summarize(run_policy(p, jobs, WorldConfig(n_gpus=16, restart_s=30.0), seed=1))
             for p in ("nopart", "oracle", "miso")}
    assert paper["miso"]["avg_jct_s"] < 0.6 * paper["nopart"]["avg_jct_s"]
    assert paper["miso"]["avg_jct_s"] < 1.3 * paper["oracle"]["avg_jct_s"]
    s = {p: summarize(run_policy(p, jobs, WorldConfig(n_gpus=16), seed=1)) for p in
         ("nopart", "optsta", "miso", "miso+")}
    assert s["miso+"]["avg_jct_s"] < min(s[p]["avg_jct_s"] for p in ("nopart", "optsta", "miso"))
    assert s["miso+"]["restarts_per_job"] < s["miso"]["restarts_per_job"]


def _truth(workload: str) -> dict[str, float]:
    from miso.mig import geometry
    from miso.sched.speeds import workload_speeds
    from miso.workloads import catalogue

    return workload_speeds(geometry("A100-40GB"), catalogue()[workload])


def test_restart_accounting__lost_work_matches_a_hand_computation():
    """Oracle on one GPU: A runs alone, B arrives at t=100 and A moves (one restart); A ends,
    B moves to the whole GPU (one restart). Jobs cannot checkpoint, so each restart throws
    away the job's progress too. Every figure below is computed from the timeline by hand."""
    from miso.mig import geometry
    from miso.optimize import optimizer_for

    restart, reconf = 60.0, 4.0
    jobs = [TraceJob("a", 0.0, 1000.0, "resnet_train64"),
            TraceJob("b", 100.0, 1e5, "bert_train2")]
    cfg = WorldConfig(n_gpus=1, restart_s=restart, reconfig_s=reconf, no_checkpoint_frac=1.0,
                      observe_speeds=False)
    r = run_policy("oracle", jobs, cfg, seed=1)
    geom = geometry("A100-40GB")
    sol = optimizer_for(geom).solve({"a": _truth("resnet_train64"), "b": _truth("bert_train2")})
    pa, pb = sol.assignment["a"].profile, sol.assignment["b"].profile
    share = {p.name: p.compute_slices / 7 for p in geom.profiles}
    sa, sb = _truth("resnet_train64")[pa], _truth("bert_train2")[pb]
    # A: 100 s of work done alone, then reconfiguration + restart wait, then all 1000 again.
    fin_a = 100.0 + reconf + restart + 1000.0 / sa
    # B: starts after the reconfiguration (first start: no wait), runs until A ends, then
    # moves to the whole GPU (reconfiguration + restart, progress lost) and runs 1e5 s.
    prog_b = (fin_a - 100.0 - reconf) * sb
    fin_b = fin_a + reconf + restart + 1e5
    lost = (100.0 + restart * share[pa]) + (prog_b + restart * 1.0)
    got = dict(zip(r.job_ids, r.finish, strict=True))
    assert got["a"] == pytest.approx(fin_a)
    assert got["b"] == pytest.approx(fin_b)
    assert list(r.restarts) == [1, 1]
    assert summarize(r)["lost_gpu_s"] == pytest.approx(lost)


def test_restart_spread__each_job_waits_its_own_drawn_cost():
    """With --restart-spread every job has its own restart cost (drawn around restart_s, same
    mean); the hand-computed timeline above holds with each job's own cost."""
    restart, reconf = 60.0, 4.0
    jobs = [TraceJob("a", 0.0, 1000.0, "resnet_train64"),
            TraceJob("b", 100.0, 1e5, "bert_train2")]
    cfg = WorldConfig(n_gpus=1, restart_s=restart, reconfig_s=reconf, no_checkpoint_frac=1.0,
                      observe_speeds=False, restart_spread=1.0)
    sim = Simulator(build_policy("oracle", jobs, cfg, 1), jobs, cfg, seed=1)
    ca, cb = sim.jobs["a"].restart_cost, sim.jobs["b"].restart_cost
    assert len({ca, cb, restart}) == 3
    r = sim.run()
    from miso.mig import geometry
    from miso.optimize import optimizer_for

    sol = optimizer_for(geometry("A100-40GB")).solve(
        {"a": _truth("resnet_train64"), "b": _truth("bert_train2")})
    fin_a = 100.0 + reconf + ca + 1000.0 / _truth("resnet_train64")[sol.assignment["a"].profile]
    got = dict(zip(r.job_ids, r.finish, strict=True))
    assert got["a"] == pytest.approx(fin_a)
    assert got["b"] == pytest.approx(fin_a + reconf + cb + 1e5)
    # Many jobs: the drawn costs spread out around restart_s and keep its mean.
    many = poisson_jobs(2000, seed=1)
    costs = [j.restart_cost for j in Simulator(
        build_policy("nopart", many, cfg, 1), many, cfg, seed=1).jobs.values()]
    assert sum(costs) / len(costs) == pytest.approx(restart, rel=0.1)
    assert min(costs) < restart / 2 and max(costs) > restart * 2


def test_restart_accounting__mps_level_switches_are_restarts():
    """MISO profiles a 2-job mix: each job pays a restart per level switch (3 levels: 2) plus
    the move into its MIG slice; the resident that ran before pays one more."""
    jobs = [TraceJob("a", 0.0, 5000.0, "resnet_train64"),
            TraceJob("b", 50.0, 5000.0, "bert_train2")]
    cfg = WorldConfig(n_gpus=1, restart_s=60.0, observe_speeds=False)
    r = run_policy("miso", jobs, cfg, seed=1)
    s = summarize(r)
    # a: stop for profiling (1) + 2 level switches + move to MIG (1) [+ a final move to the
    # whole GPU when b ends, if a is still running]; b: 2 switches + move (1).
    got = dict(zip(r.job_ids, r.restarts, strict=True))
    assert got["b"] >= 3 and got["a"] >= 4
    assert s["profiling_gpu_s"] == pytest.approx(3 * 10.0 + 3 * 60.0 + 4.0, rel=0.05)


def test_misoplus__never_restarts_a_job_that_cannot_checkpoint():
    jobs = poisson_jobs(300, seed=2, mean_interarrival_s=30.0)
    cfg = WorldConfig(n_gpus=8, restart_s=120.0, no_checkpoint_frac=1.0)
    r = run_policy("miso+", jobs, cfg, seed=2)
    assert int(r.restarts.sum()) == 0
    # ... while the paper's MISO restarts them (and throws their progress away).
    m = run_policy("miso", jobs, cfg, seed=2)
    assert int(m.restarts.sum()) > 0 and m.lost_gpu_s > r.lost_gpu_s


def test_non_a100_model_runs(small_jobs):
    r = run_policy("miso", small_jobs[:40], WorldConfig(gpu_model="H100", n_gpus=4), seed=1)
    assert len(r.job_ids) == 40


# -- traces ---------------------------------------------------------------------------------
def _csv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(text)
    return p


@pytest.mark.parametrize(("text", "msg"), [
    ("job_id,duration_s\n1,10\n", "missing column 'submit_time_s'"),
    ("job_id,submit_time_s,duration_s\n1,0,10\n2,5,-3\n", ":3: duration_s -3 is not positive"),
    ("job_id,submit_time_s,duration_s\n1,abc,10\n", ":2: submit_time_s 'abc' is not a number"),
    ("job_id,submit_time_s,duration_s,workload\n1,0,10,nope\n", "unknown workload 'nope'"),
    ("job_id,submit_time_s,duration_s\n1,,10\n2,3,10\n", "submit_time_s is empty in 1 of 2"),
])
def test_trace__malformed_rows_are_reported_with_row_and_problem(tmp_path, text, msg):
    with pytest.raises(TraceError, match=msg.replace("(", r"\(")):
        load_trace(_csv(tmp_path, text))


def test_trace__extra_columns_sampled_workloads_window_and_shipped(tmp_path):
    p = _csv(tmp_path, "job_id,submit_time_s,duration_s,user\n1,100,10,x\n2,50,20,y\n"
                       "3,500,5,z\n")
    a = load_trace(p, seed=3)
    assert [j.id for j in a] == ["2", "1", "3"] and a[0].submit_s == 0.0
    assert a == load_trace(p, seed=3)
    w = load_trace(p, window_s=(60, 600), time_scale=0.5)
    assert [(j.id, j.submit_s) for j in w] == [("1", 0.0), ("3", 200.0)]
    m = load_trace("miso100")
    assert len(m) == 100 and m[-1].submit_s > 0
    ph = load_trace("philly", max_jobs=50)
    assert len(ph) == 50


def test_poisson__lognormal_durations_keep_arrivals_workloads_and_mean():
    base = poisson_jobs(3000, seed=2)
    for sigma in (1.0, 2.0):
        ln = poisson_jobs(3000, seed=2, duration_dist="lognormal", duration_sigma=sigma)
        assert [(j.submit_s, j.workload) for j in ln] == [(j.submit_s, j.workload)
                                                          for j in base]
        mean = sum(j.duration_s for j in base) / len(base)
        got = sum(j.duration_s for j in ln) / len(ln)
        assert got == pytest.approx(mean, rel=0.25 * sigma)
    narrow = poisson_jobs(500, seed=2, duration_dist="lognormal", duration_sigma=0.1)
    wide = poisson_jobs(500, seed=2, duration_dist="lognormal", duration_sigma=2.0)
    spread = [max(j.duration_s for j in x) / min(j.duration_s for j in x)
              for x in (narrow, wide)]
    assert spread[0] < 3 < 100 < spread[1]
    with pytest.raises(ValueError, match="duration_dist"):
        poisson_jobs(5, duration_dist="pareto")


# -- CLI ------------------------------------------------------------------------------------
@pytest.fixture()
def app() -> typer.Typer:
    from miso.cli.simulate import simulate

    a = typer.Typer()
    a.command("simulate")(simulate)
    a.command("noop")(lambda: None)
    return a


def test_cli__json_shape_and_determinism(app, tmp_path):
    out1, out2 = tmp_path / "a.json", tmp_path / "b.json"
    args = ["simulate", "--gpus", "4", "--jobs", "40", "--mean-interarrival", "30",
            "--policies", "nopart,miso,miso+", "--seed", "3"]
    r = CliRunner().invoke(app, [*args, "--json", str(out1), "--plot", str(tmp_path / "fig")])
    assert r.exit_code == 0, r.output
    CliRunner().invoke(app, [*args, "--json", str(out2)])
    d1, d2 = json.loads(out1.read_text()), json.loads(out2.read_text())
    assert set(d1["policies"]) == {"nopart", "miso", "miso+"}
    for s in d1["policies"].values():
        assert {"avg_jct_s", "p95_jct_s", "makespan_s", "stp", "restarts"} <= set(s)
    for p in d1["policies"]:
        for k in ("avg_jct_s", "makespan_s", "stp", "restarts"):
            assert d1["policies"][p][k] == d2["policies"][p][k]
    assert (tmp_path / "fig" / "bars.png").stat().st_size > 0
    assert (tmp_path / "fig" / "relative_jct_cdf.png").stat().st_size > 0


def test_cli__malformed_trace_exits_nonzero_with_one_line(app, tmp_path):
    p = _csv(tmp_path, "job_id,submit_time_s,duration_s\n1,0,10\n2,x,5\n")
    r = CliRunner().invoke(app, ["simulate", "--trace", str(p), "--gpus", "2"])
    assert r.exit_code != 0
    assert ":3: submit_time_s 'x' is not a number" in r.output
    assert "Traceback" not in r.output


def test_cli__sweep_jobs_per_gpu(app, tmp_path):
    out = tmp_path / "s.json"
    r = CliRunner().invoke(app, ["simulate", "--sweep", "jobs-per-gpu", "--policies",
                                 "nopart,miso", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())["sweep"]
    assert d["kind"] == "jobs-per-gpu" and set(d["results"]) == {str(k) for k in range(1, 11)}


def test_cli__trace_with_every_job_at_zero_is_a_fixed_mix(app, tmp_path):
    """A CSV whose jobs all arrive at t=0 on one GPU (the fixed-mix experiment): NoPart runs
    them back to back in job order, JCTs by hand; every policy finishes them."""
    p = _csv(tmp_path, "job_id,submit_time_s,duration_s,workload\n"
                       "a,0,600,resnet_train64\nb,0,600,bert_train2\nc,0,300,resnet_train64\n")
    out = tmp_path / "m.json"
    r = CliRunner().invoke(app, ["simulate", "--trace", str(p), "--gpus", "1", "--policies",
                                 "nopart,optsta,miso,miso+", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())["policies"]
    assert d["nopart"]["avg_jct_s"] == pytest.approx((600 + 1200 + 1500) / 3)
    assert all(d[q]["avg_jct_s"] > 0 for q in ("optsta", "miso", "miso+"))


def test_cli__duration_dist_and_restart_spread(app, tmp_path):
    out = tmp_path / "l.json"
    args = ["simulate", "--gpus", "4", "--jobs", "30", "--mean-interarrival", "30",
            "--policies", "nopart,miso+", "--duration-dist", "lognormal",
            "--duration-sigma", "2", "--restart-spread", "0.5", "--json", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["config"]["duration_dist"] == "lognormal" and d["config"]["restart_spread"] == 0.5
    plain = tmp_path / "p.json"
    CliRunner().invoke(app, args[:9] + ["--json", str(plain)])
    assert json.loads(plain.read_text())["policies"]["nopart"]["avg_jct_s"] != \
        d["policies"]["nopart"]["avg_jct_s"]
    bad = CliRunner().invoke(app, ["simulate", "--duration-dist", "pareto"])
    assert bad.exit_code != 0 and "--duration-dist" in bad.output


# -- no regret (issue 17) -------------------------------------------------------------------
def test_misoplus__light_load_pays_no_profiling_and_matches_nopart():
    """40 GPUs, one job every 240 s: every newcomer finds an idle GPU. miso+ profiles nobody
    (the level switch would be a restart that buys nothing) and equals NoPart job by job."""
    jobs = poisson_jobs(200, seed=2, mean_interarrival_s=240.0)
    cfg = WorldConfig(n_gpus=40, restart_s=120.0)
    plus = run_policy("miso+", jobs, cfg, seed=2, record=True)
    nop = run_policy("nopart", jobs, cfg, seed=2)
    assert not [d for _, d in plus.log if isinstance(d, StartProfiling)]
    assert int(plus.restarts.sum()) == 0
    assert list(plus.finish) == pytest.approx(list(nop.finish))
    # the issue-8 rule profiled every newcomer (one restart each) and lost to NoPart
    old = run_policy("miso+", jobs, cfg, seed=2, profile_when="always")
    assert old.restarts.mean() > 0.9 and old.jct.mean() > nop.jct.mean()


def test_misoplus__busy_cluster_still_profiles_newcomers():
    """The paper's load (40 GPUs, 60 s): sharing is expected, so a newcomer that finds an idle
    GPU is profiled there alone."""
    jobs = poisson_jobs(300, seed=1, mean_interarrival_s=60.0)
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=40, restart_s=60.0), seed=1, record=True)
    prof = [d for _, d in r.log if isinstance(d, StartProfiling)]
    assert len(prof) >= 10 and all(len(d.jobs) == 1 for d in prof)


def test_misoplus__fixed_mix_planned_together_without_restarts_at_t0():
    """k jobs submitted at t=0 on one GPU: no job is started alone only to be restarted by the
    next one of the batch; one job alone runs as on NoPart."""
    cfg = WorldConfig(n_gpus=1, restart_s=120.0, observe_speeds=False)
    from miso.sim.run import fixed_jobs

    one = run_policy("miso+", fixed_jobs(1, seed=1), cfg, seed=1)
    assert one.jct.mean() == pytest.approx(600.0) and int(one.restarts.sum()) == 0
    r = run_policy("miso+", fixed_jobs(4, seed=1), cfg, seed=1, record=True)
    first = [d for _, d in r.log if isinstance(d, ApplyLayout)][0]
    assert len(first.assignment) >= 2  # the first plan already holds several of the batch
    assert r.jct.mean() < run_policy("nopart", fixed_jobs(4, seed=1), cfg, seed=1).jct.mean()


def test_arrival_clock__offered_load_is_littles_law_after_enough_arrivals():
    from miso.sched.policies.arrivals import ArrivalClock

    c = ArrivalClock(quiet_gaps=8.0)
    for i in range(10):
        c.note(i * 100.0, 4.0, 3000.0)
    assert c.offered_load(3000.0) is None  # too few arrivals to tell the rate
    for i in range(10, 40):
        c.note(i * 100.0, 4.0, 3000.0 if i % 2 else None)
    # Little's law at the rate's lower bound from 40 arrivals (relative error 1/sqrt(40))
    assert c.offered_load(1000.0) == pytest.approx((3000 * 0.5 + 0.5 * 3000 * (20 / 40)
                                                    + 1000.0 * (10 / 40)) / 100.0
                                                   * (1 - 40 ** -0.5), rel=0.2)


def test_misoplus__learns_each_jobs_restart_cost_from_its_progress_reports():
    """Per-job restart costs drawn around restart_s (--restart-spread): miso+ is told only the
    mean and measures each restarted job's cost (plan to first progress after the relaunch:
    the job's drawn wait plus the reconfiguration)."""
    from miso.sched.policies import MisoPlus

    jobs = poisson_jobs(200, seed=3, mean_interarrival_s=30.0)
    cfg = WorldConfig(n_gpus=8, restart_s=120.0, restart_spread=1.0, observe_speeds=False)
    pol = build_policy("miso+", jobs, cfg, 3)
    assert isinstance(pol, MisoPlus)
    sim = Simulator(pol, jobs, cfg, seed=3)
    truth = {j: sj.restart_cost for j, sj in sim.jobs.items()}
    seen: dict[str, float] = {}
    decide = pol.decide

    def spy(now, event, state):  # noqa: ANN001, ANN202
        out = decide(now, event, state)
        seen.update(pol.restarts.seen)
        return out

    pol.decide = spy  # type: ignore[method-assign]
    sim.run()
    assert len(seen) >= 5
    for j, cost in seen.items():
        assert cost - truth[j] in (pytest.approx(0.0, abs=1e-6), pytest.approx(4.0, abs=1e-6))
    assert pol.restarts.stats[1] >= len(seen)


def test_misoplus__a_long_first_job_is_profiled_before_the_rate_is_known():
    """Before the arrival rate is known, a lone newcomer whose profiling costs under half a
    per cent of its work is profiled anyway (the saturated Philly trace: long jobs that will
    share a GPU for days); a short one is not."""
    cfg = WorldConfig(n_gpus=4, restart_s=120.0)
    long = [TraceJob("a", 0.0, 200_000.0, "resnet_train64")]
    short = [TraceJob("a", 0.0, 2_000.0, "resnet_train64")]
    for jobs, want in ((long, 1), (short, 0)):
        r = run_policy("miso+", jobs, cfg, seed=1, record=True)
        assert len([d for _, d in r.log if isinstance(d, StartProfiling)]) == want


def test_misoplus__measured_restart_costs_replace_a_wrong_told_cost():
    """Told 10 s per restart, every restart really costs 300 s: miso+ measures the cost from
    its jobs' progress reports and prices its next restarts with it, so it restarts about half
    as often and finishes sooner than when it plans with the told cost (learning ignored), and
    about as well as when told the truth. Fails if the learned cost is not used."""
    jobs = poisson_jobs(200, seed=2)
    cfg = WorldConfig(n_gpus=40, restart_s=300.0)
    learned = run_policy("miso+", jobs, cfg, seed=2, restart_s=10.0)
    told = run_policy("miso+", jobs, cfg, seed=2, restart_s=10.0, restart_costs=ToldRestartPrice)
    truth = run_policy("miso+", jobs, cfg, seed=2)
    assert learned.restarts.mean() < 0.7 * told.restarts.mean()
    assert learned.jct.mean() < 0.98 * told.jct.mean()
    assert learned.jct.mean() == pytest.approx(truth.jct.mean(), rel=0.01)


def test_misoplus__fixed_mix_runs_a_few_at_a_time_when_restarts_are_dear():
    """Seven ten-minute jobs at t=0 on one GPU. With restarts at 120 s (a fifth of a job) miso+
    runs at most four side by side (the rest wait for a freed instance) and beats the best
    static partition found in hindsight on this mix; with 30 s restarts growing into freed
    slices is cheap and the whole batch may run at once."""
    from miso.sim.run import fixed_jobs

    jobs = fixed_jobs(7, seed=1)
    dear = WorldConfig(n_gpus=1, restart_s=120.0)
    r = run_policy("miso+", jobs, dear, seed=1, record=True)
    plans = [d for _, d in r.log if isinstance(d, ApplyLayout)]
    assert max(len(d.assignment) for d in plans) <= 4
    assert r.jct.mean() < run_policy("optsta", jobs, dear, seed=1).jct.mean()
    uncapped = run_policy("miso+", jobs, dear, seed=1, batch_jobs=0, record=True)
    assert max(len(d.assignment) for _, d in uncapped.log if isinstance(d, ApplyLayout)) > 4
    cheap = run_policy("miso+", jobs, WorldConfig(n_gpus=1, restart_s=30.0), seed=1,
                       record=True)
    assert max(len(d.assignment) for _, d in cheap.log if isinstance(d, ApplyLayout)) > 4


def _demo_stream_in_sim(policy: str, seed: int, **kw: object) -> float:
    """The demo's stream (20 jobs of ~20 s within 20 s on 4 GPUs) replayed in the simulator
    with live's knowledge (no declared work; miso+ told its default restart cost)."""
    from miso.cli.demo_cluster import demo_jobs, demo_trace

    trace = demo_trace(demo_jobs(20, seed=seed))
    cfg = WorldConfig(n_gpus=4, restart_s=3.0, profile_s_per_level=1.0, reconfig_s=0.5,
                      declare_work=False)
    if policy == "miso+":
        kw = {"restart_s": 60.0, **kw}
    return float(run_policy(policy, trace, cfg, seed=1, **kw).jct.mean())


def test_misoplus__a_burst_lands_on_slots_that_stay_as_optsta_does():
    # Issue 17: on the demo's burst OptSta's fixed layout beat miso+ by 20 % (each arrival
    # repartitioned a GPU and restarted its first jobs again). With the landing layout
    # miso+ comes within 8 % of OptSta in these seeds (1.27x before), and far better than
    # without it.
    for seed in (0, 2, 4):
        burst = _demo_stream_in_sim("miso+", seed)
        assert burst < 0.9 * _demo_stream_in_sim("miso+", seed, burst_jobs=0)
        assert burst <= 1.08 * _demo_stream_in_sim("optsta", seed)


def test_misoplus__no_burst_in_a_busy_poisson_stream():
    # The burst rule must not touch the busy settings (60 s between jobs, 30-300 s
    # restarts): it never fires there.
    from miso.sched.policies import MisoPlus
    from miso.sched.policies.burst import Burst

    fired: list[float] = []

    class WatchedBurst(Burst):
        def burst(self, sc):  # noqa: ANN001, ANN202
            out = super().burst(sc)
            if out:
                fired.append(sc.cycle.now)
            return out

    class Watched(MisoPlus):
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)
            self.bursts = WatchedBurst(self, self.bursts.opts)

    jobs = poisson_jobs(300, seed=3)
    for n, restart in ((16, 300.0), (40, 30.0)):
        cfg = WorldConfig(n_gpus=n, restart_s=restart)
        pol = Watched(restart_s=restart, estimator=build_policy("miso+", jobs, cfg, 3).estimator,
                      profile_seconds_per_level=cfg.profile_s_per_level)
        Simulator(pol, jobs, cfg, seed=3).run()
    assert fired == []


def test_misoplus__sixteen_jobs_on_sixteen_gpus_are_no_burst():
    # Before any job's work is known a 3,000 s guess made 16 jobs arriving over 20 s on 16
    # GPUs look like a burst: they landed on slices (1.09x NoPart). Each runs alone now.
    from miso.cli.demo_cluster import demo_jobs, demo_trace

    for seed in (0, 1):
        trace = demo_trace(demo_jobs(16, seed=seed))
        cfg = WorldConfig(n_gpus=16, restart_s=3.0, profile_s_per_level=1.0, reconfig_s=0.5,
                          declare_work=False)
        plus = run_policy("miso+", trace, cfg, seed=1, restart_s=60.0).jct.mean()
        assert plus <= run_policy("nopart", trace, cfg, seed=1).jct.mean() + 1e-9


def _demo_run_in_sim(seed: int, **kw: object):  # noqa: ANN202 - a SimResult
    """miso+ on the demo's stream in the simulator, as :func:`_demo_stream_in_sim`."""
    from miso.cli.demo_cluster import demo_jobs, demo_trace

    cfg = WorldConfig(n_gpus=4, restart_s=3.0, profile_s_per_level=1.0, reconfig_s=0.5,
                      declare_work=False)
    return run_policy("miso+", demo_trace(demo_jobs(20, seed=seed)), cfg, seed=1,
                      **{"restart_s": 60.0, **kw})


def test_misoplus__a_burst_is_seen_from_the_first_progress_reports():
    # Issue 17: live (and here) a job declares no work, and miso+ learned a job's work only
    # when it re-planned the job's GPU, which a job alone on a whole GPU never needs: the
    # demo's burst showed only when the fifth job found every GPU taken, and the first four
    # were restarted (13 restarts in 20 jobs, 1.05-1.10x OptSta). Read from the jobs' first
    # progress reports, it shows by the third arrival: at most the two first jobs restart,
    # and miso+ comes within 3 % of OptSta.
    for seed in (0, 2, 4):
        r = _demo_run_in_sim(seed)
        assert r.restarts.sum() <= 2
        assert r.jct.mean() <= 1.03 * _demo_stream_in_sim("optsta", seed)


def test_misoplus__a_burst_restarts_a_whole_gpu_job_only_when_no_landing_slot_is_free():
    # A job that started alone on a whole GPU before the burst showed is restarted (to land
    # the GPU) only when no other GPU has a free landing slot for the newcomer: until then
    # it keeps its GPU, and a short one may end first. Before, the next newcomer went to the
    # least crowded GPU, that whole GPU, restarting it while two landed GPUs had free slots.
    import inspect

    from miso.sched.policies import MisoPlus

    burst_jobs = inspect.signature(MisoPlus).parameters["burst_jobs"].default
    for seed in (0, 1, 2):
        r = _demo_run_in_sim(seed, record=True)
        now: dict[str, dict] = {}   # GPU -> its last planned assignment
        checked = 0
        for _, d in r.log:
            if not isinstance(d, ApplyLayout):
                continue
            cur = now.get(d.gpu, {})
            whole = [j for j in (d.why or {}).get("restarts", [])
                     if j in cur and cur[j].profile == "7g.40gb"]
            if whole:
                checked += 1
                others = [len(a) for g, a in now.items() if g != d.gpu and a
                          and all(pl.profile != "7g.40gb" for pl in a.values())]
                assert all(n >= burst_jobs for n in others), (seed, whole, others)
            now[d.gpu] = dict(d.assignment)
        assert checked  # the first jobs did land at last


def test_misoplus__a_burst_places_no_newcomer_on_a_gpu_its_landed_jobs_fill():
    # Live, two landed jobs that need large slices (4g + 3g) filled a GPU with fewer jobs
    # than the others: as the least crowded GPU it was chosen for every newcomer, whose
    # plan failed (landed jobs keep their slices) and requeued it, and the queue stalled
    # until a job ended while other GPUs had free slots. A GPU is chosen only where the
    # newcomer fits beside its landed jobs now.
    import random

    from miso.sched.policies import MisoPlus
    from miso.sched.policies.placing import GpuChoice

    class UnguardedChoice(GpuChoice):  # the old choice: landed jobs not checked at placement
        def fits_beside_pinned(self, g, job, sc):  # noqa: ANN001, ANN202
            bursts = self.pol.bursts
            bursts.landed = lambda sc, g: set()
            try:
                return super().fits_beside_pinned(g, job, sc)
            finally:
                del bursts.landed

    class Unguarded(MisoPlus):
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)
            self.choice = UnguardedChoice(self, self.choice.opts)

    rng = random.Random(1)
    trace = [TraceJob(f"j{i:02d}", 20.0 * i / 9, 20 * rng.uniform(0.5, 1.5),
                      rng.choice(["transformer_train128", "mobilenet_train64"]))
             for i in range(10)]
    cfg = WorldConfig(n_gpus=2, restart_s=3.0, profile_s_per_level=1.0, reconfig_s=0.5,
                      declare_work=False)
    est = build_policy("miso+", trace, cfg, 1).estimator
    out = {}
    for cls in (MisoPlus, Unguarded):
        pol = cls(restart_s=60.0, estimator=est, profile_seconds_per_level=1.0)
        out[cls] = Simulator(pol, trace, cfg, seed=1).run().jct.mean()
    assert out[MisoPlus] < 0.95 * out[Unguarded]
