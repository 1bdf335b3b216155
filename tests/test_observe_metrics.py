"""Prometheus metrics and the decision log against known scenarios: the simulator (exact,
deterministic) and the live controller on emulated GPUs, read back through ``GET /metrics``
with prometheus-client's own parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from helpers import emu
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig
from miso.observe import DecisionLog, Metrics, Observer, attach, policy_estimates, read_records
from miso.observe.routes import make_app
from miso.sim.engine import Simulator
from miso.sim.run import build_policy, run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(sm: dict, name: str, **labels: str) -> float:
    return sm[(name, tuple(sorted(labels.items())))]


def test_simulated_three_jobs_two_gpus__restart_and_reconfiguration_counters() -> None:
    # a -> gpu0 (alone: 7g), b -> gpu1 (alone: 7g), c -> gpu0 (least crowded, first in order):
    # gpu0 is split and a, moved off its 7g, restarts once; when a finishes, c (alone again)
    # moves to the 7g: a second repartition restart. Four layout changes in all.
    jobs = [TraceJob("a", 0.0, 600.0, "resnet_train128"),
            TraceJob("b", 10.0, 600.0, "bert_train2"),
            TraceJob("c", 20.0, 600.0, "gnn_train512")]
    m = Metrics()
    log = DecisionLog(None)
    res = run_policy("oracle", jobs, WorldConfig(gpu_model="A100-40GB", n_gpus=2), 1,
                     observer=lambda pol: Observer(m, log, estimates=policy_estimates(pol)))
    sm = samples(m.render().decode())
    assert value(sm, "miso_job_restarts_total", reason="repartition") == 2
    assert value(sm, "miso_job_restarts_total", reason="repartition") == res.restarts.sum()
    for reason in ("profiling", "preemption", "node_loss"):
        assert value(sm, "miso_job_restarts_total", reason=reason) == 0
    assert value(sm, "miso_reconfigurations_total") == 4
    assert value(sm, "miso_decisions_total", kind="PlaceJob") == 3
    assert value(sm, "miso_jobs_completed_total", outcome="finished") == 3
    assert value(sm, "miso_job_completion_seconds_count") == 3
    assert value(sm, "miso_job_completion_seconds_sum") == pytest.approx(res.jct.sum())
    assert value(sm, "miso_job_queueing_seconds_count") == 3
    # the decision log explains the split: c's arrival, a restarted, a positive gain
    split = [r for r in log.recent() if r["kind"] == "ApplyLayout" and len(r["jobs"]) == 2]
    assert len(split) == 1
    rec = split[0]
    assert rec["trigger"] == "arrival" and rec["cause"]["job"] == "c"
    assert rec["restarts"] == ["a"] and rec["current_layout"] == ["7g.40gb@0"]
    assert rec["objective"] == pytest.approx(sum(rec["speeds"][j][p.split("@")[0]]
                                                 for j, p in rec["assignment"].items()), 1e-3)
    assert rec["current_objective"] == pytest.approx(1.0)
    assert rec["expected_gain"] == pytest.approx(rec["objective"] - 1.0, abs=1e-3)


def test_simulated_profiling_restarts_are_counted_as_profiling() -> None:
    # miso (profiles under MPS): a alone runs on 7g; b joins -> the mix is profiled, a (running)
    # is stopped for it: one profiling restart; after the profile both move to their slices.
    jobs = [TraceJob("a", 0.0, 900.0, "resnet_train128"),
            TraceJob("b", 10.0, 900.0, "bert_train2")]
    m = Metrics()
    log = DecisionLog(None)
    cfg = WorldConfig(gpu_model="A100-40GB", n_gpus=1)
    pol = build_policy("miso", jobs, cfg, 1)
    sim = Simulator(pol, jobs, cfg, seed=1,
                    observer=Observer(m, log, estimates=policy_estimates(pol)))
    sim.run()
    sm = samples(m.render().decode())
    assert value(sm, "miso_job_restarts_total", reason="profiling") == 1
    total = sum(value(sm, "miso_job_restarts_total", reason=r)
                for r in ("profiling", "repartition", "preemption", "node_loss"))
    # decision-caused restarts, as the scheduling state counts them (the simulator's own
    # count also charges every MPS level switch of a profiling run)
    assert total == sum(js.restarts for js in sim.state.jobs.values())
    assert value(sm, "miso_profiling_seconds_count") == 1
    prof = [r for r in log.recent() if r["kind"] == "StartProfiling"]
    assert prof and prof[0]["trigger"] == "arrival" and set(prof[0]["jobs"]) == {"a", "b"}
    after = [r for r in log.recent() if r["kind"] == "ApplyLayout" and r["trigger"] == "profiled"]
    assert after and "arrival of job b" in after[0]["origin"]



def test_live_controller__metrics_after_three_jobs_and_one_repartition(tmp_path: Path) -> None:
    cfg = ControllerConfig(policy="miso", estimator="true", poll_interval=0.1,
                           checkpoint_timeout=5.0, profile_warmup_s=0.1)
    c = LocalCluster(tmp_path / "c", gpus_per_node=2, config=cfg, rate_window=0.5, start=False)
    try:
        store_dir = tmp_path / "c"
        from miso.controller import Controller, JobStore

        ctl = Controller(JobStore(store_dir / "miso.db"), c.transport, cfg,
                         checkpoint_root=store_dir / "checkpoints")
        obs = attach(ctl, store_dir)
        c.controller = ctl.start()
        client = TestClient(make_app(ctl, obs))

        def running(*ids: str) -> bool:
            st = {j["id"]: j["state"] for j in ctl.status()["jobs"]}
            return all(st.get(i) == "running" for i in ids)

        a = ctl.submit(emu("resnet_train128", 120))
        wait_for(lambda: running(a), 60)
        b = ctl.submit(emu("bert_train2", 120))
        wait_for(lambda: running(a, b), 60)
        cj = ctl.submit(emu("gnn_train512", 120))
        wait_for(lambda: running(a, b, cj) and not any(
            g["pending_plan"] for g in ctl.status()["gpus"]), 90)
        r = client.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        sm = samples(r.text)
        assert value(sm, "miso_job_restarts_total", reason="repartition") == 1
        assert value(sm, "miso_reconfigurations_total") == 3
        assert value(sm, "miso_decisions_total", kind="PlaceJob") == 3
        assert value(sm, "miso_decisions_total", kind="ApplyLayout") == 3
        assert value(sm, "miso_jobs", state="running", owner="") == 3
        assert value(sm, "miso_queue_length") == 0
        gpus = {g["id"]: g for g in ctl.status()["gpus"]}
        split = next(g for g, v in gpus.items() if len(v["jobs"]) == 2)
        assert value(sm, "miso_gpu_jobs", gpu=split) == 2
        assert value(sm, "miso_gpu_phase", gpu=split, phase="running") == 1
        assert value(sm, "miso_gpu_busy_compute_slices", gpu=split) == 7
        assert value(sm, "miso_gpu_layout_info", gpu=split, node="node0", model="A100-40GB",
                     layout=",".join(gpus[split]["layout"])) == 1
        assert value(sm, "miso_reconfiguration_seconds_count") == 3
        assert value(sm, "miso_checkpoint_seconds_count") >= 1
        assert value(sm, "miso_controller_loop_lag_seconds_count") > 0
        # the decision log on disk says why the GPU was split
        recs = read_records(store_dir / "decisions.jsonl", gpu=split)
        rec = [x for x in recs if x["kind"] == "ApplyLayout"][-1]
        assert rec["trigger"] == "arrival" and rec["cause"]["job"] == cj
        assert len(rec["restarts"]) == 1 and rec["expected_gain"] > 0
        ev = client.get("/api/v1/events", params={"job": cj}).json()["events"]
        assert any(e["kind"] == "ApplyLayout" and "gain" in e["text"] for e in ev)
        assert client.get("/api/v1/metrics-nope").status_code == 404
    finally:
        c.close()


def test_node_loss_preemption_and_failed_layouts_counted_by_reason() -> None:
    from miso.mig import Placement
    from miso.sched import (
        ApplyLayout,
        ClusterState,
        GpuAdded,
        GpuRemoved,
        JobSpec,
        JobSubmitted,
        LayoutApplied,
        LayoutFailed,
        PlaceJob,
        RequeueJob,
    )

    m = Metrics()
    obs = Observer(m, DecisionLog(None))
    st = ClusterState()
    t = [0.0]

    def ev(e: object) -> None:
        t[0] += 1.0
        obs.on_event(t[0], e, st)  # type: ignore[arg-type]
        st.observe(t[0], e)  # type: ignore[arg-type]

    def dec(d: object) -> None:
        st.apply(t[0], d)  # type: ignore[arg-type]
        obs.on_decision(t[0], d, st)  # type: ignore[arg-type]

    full = Placement(0, "7g.40gb")
    for g in ("g0", "g1"):
        ev(GpuAdded(g, "A100-40GB"))
    for j, g in (("a", "g0"), ("b", "g1")):
        ev(JobSubmitted(JobSpec(j, j, 4.0)))
        dec(PlaceJob(j, g))
        dec(ApplyLayout(g, st.new_plan_id(), (full,), {j: full}))
        ev(LayoutApplied(g, st.last_plan_id))
    dec(RequeueJob("a", "make room"))        # a was running: a preemption restart
    ev(GpuRemoved("g1"))                     # b was running there: a node-loss restart
    ev(JobSubmitted(JobSpec("c", "c", 4.0)))
    dec(PlaceJob("c", "g0"))
    pid = st.new_plan_id()
    dec(ApplyLayout("g0", pid, (full,), {"c": full}))
    ev(LayoutFailed("g0", pid, "driver said no"))
    sm = samples(m.render().decode())
    assert value(sm, "miso_job_restarts_total", reason="preemption") == 1
    assert value(sm, "miso_job_restarts_total", reason="node_loss") == 1
    assert value(sm, "miso_job_restarts_total", reason="repartition") == 0
    assert value(sm, "miso_failures_total", kind="layout") == 1
    assert value(sm, "miso_reconfigurations_total") == 2
    assert value(sm, "miso_controller_events_total", kind="GpuRemoved") == 1
