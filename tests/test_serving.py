"""Inference services: catalogue, replica queue, traces, covering planner, per-request sim."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from miso.mig import GPU_MODELS
from miso.sched.serviceplan import PlannerConfig, ServicePlanner, spread_ok
from miso.sched.services import (
    DrainReplica,
    ReplicaDrained,
    ReplicaReady,
    ServiceRateObserved,
    ServiceSpec,
    ServiceSubmitted,
    StartReplica,
)
from miso.serving import catalog
from miso.serving.replica import simulate_replica
from miso.serving.traces import RequestTrace, azure_llm_trace, diurnal_trace, load_trace
from miso.sim.servicesim import ReplicaRecord, ServicesRun, measure


def test_catalogue_follows_mlperf_slice_ratios_and_covers_every_gpu_model():
    for name in ("resnet50", "bert-large", "3d-unet", "llama2-7b"):
        assert name in catalog.MODELS
    # 1g over full at large batch: (1/7) x seven_1g, the MLPerf v1.1 ratio
    for m in ("resnet50", "bert-large", "3d-unet"):
        mdl = catalog.MODELS[m]
        thr = {p: 64 / catalog.service_time_s(m, "A100-40GB", p, 64) for p in ("1g.5gb",
                                                                               "7g.40gb")}
        lat = {p: catalog.service_time_s(m, "A100-40GB", p, 1) for p in ("1g.5gb", "7g.40gb")}
        assert 0.10 < thr["1g.5gb"] / thr["7g.40gb"] < 0.15
        assert lat["1g.5gb"] / lat["7g.40gb"] == pytest.approx(min(7.0, mdl.latency_cap))
    for gm, model in GPU_MODELS.items():
        for p in model.default_profiles():
            assert catalog.service_time_s("bert-large", gm, p.name, 4) > 0
    # the LLM's batch is capped by the slice's memory; it does not fit a 10 GB slice
    assert catalog.max_batch("llama2-7b", "A100-40GB", "2g.10gb") == 0
    assert 0 < catalog.max_batch("llama2-7b", "A100-40GB", "3g.20gb") < \
        catalog.max_batch("llama2-7b", "A100-40GB", "7g.40gb")
    assert catalog.capacity_rps("llama2-7b", "A100-40GB", "2g.10gb", 10_000) == 0.0


def test_capacity_meets_its_slo_and_grows_with_the_slice():
    caps = [catalog.capacity_rps("bert-large", "A100-40GB", p, 50) for p in
            ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")]
    assert caps == sorted(caps) and caps[0] > 0
    assert catalog.tail_latency_s("bert-large", "A100-40GB", "3g.20gb", caps[2]) <= 0.050
    assert catalog.capacity_rps("3d-unet", "A100-40GB", "1g.5gb", 100) == 0.0  # batch 1 > SLO


def test_replica_queue_by_hand():
    # batch time 0.5 + 0.1 b, max batch 2; arrivals 0, .1, .15, .2, 5, 5.05
    a = np.array([0.0, 0.1, 0.15, 0.2, 5.0, 5.05])
    run = simulate_replica(a, lambda b: 0.5 + 0.1 * b, 2)
    # [0] alone 0-0.6; [1,2] 0.6-1.3; [3] 1.3-1.9; [4] 5.0-5.6; [5] 5.6-6.2
    assert run.latency_s == pytest.approx([0.6, 1.2, 1.15, 1.7, 0.6, 1.15])
    assert run.batches == 5
    dropped = simulate_replica(a, lambda b: 0.5 + 0.1 * b, 2, drop_after_s=0.5)
    assert dropped.dropped == 2  # [3] waited 1.1 s, [5] 0.55 s


def test_hand_computed_attainment_on_a_tiny_trace():
    # one replica of bert-large on 7g.40gb, ready at 0; three requests 1 s apart are each
    # served alone in the batch-1 time; a fourth arrives with no replica (drained at 3.5 s)
    spec = ServiceSpec("t", "o", "bert-large", slo_p99_ms=1.0, min_replicas=1)
    tr = RequestTrace("tiny", np.array([0.0, 1.0, 2.0, 4.0]), np.ones(4))
    rec = ReplicaRecord("t", "t-r0", "gpu0", "7g.40gb", 7, 100.0, 0.0, 0.0, 3.5, 4.5)
    run = measure(ServicesRun("x", 10.0, [rec]), [(spec, tr)], "A100-40GB")
    o = run.outcomes["t"]
    t1 = catalog.service_time_s("bert-large", "A100-40GB", "7g.40gb", 1)
    assert t1 > 0.001  # 2 ms > the 1 ms SLO: served but late
    assert o.dropped == 1 and o.attainment == 0.0
    spec2 = ServiceSpec("t", "o", "bert-large", slo_p99_ms=5.0)
    o2 = measure(ServicesRun("x", 10.0, [rec]), [(spec2, tr)], "A100-40GB").outcomes["t"]
    assert o2.attainment == pytest.approx(3 / 4)  # 3 on time, 1 dropped
    assert o2.p50_ms == pytest.approx(t1 * 1000)
    assert o2.slice_hours == pytest.approx(4.5 / 3600)


def _ack_all(p: ServicePlanner, now: float, ds: list) -> list:
    """Acknowledge decisions at once (replicas ready, drains done); return follow-ups."""
    out = []
    for d in ds:
        if isinstance(d, StartReplica):
            out += p.observe(now, ReplicaReady(d.service, d.replica))
        elif isinstance(d, DrainReplica):
            out += p.observe(now, ReplicaDrained(d.service, d.replica))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_covering_holds_in_every_decision_on_random_streams(seed):
    rng = np.random.default_rng(seed)
    p = ServicePlanner({f"gpu{i}": "A100-40GB" for i in range(16)},
                       PlannerConfig(scale_in_delay_s=60, cooldown_s=30))
    specs = [ServiceSpec("a", "x", "bert-large", 50, min_replicas=2),
             ServiceSpec("b", "y", "3d-unet", 2000, min_replicas=1, headroom=0.5),
             ServiceSpec("c", "z", "resnet50", 10, min_replicas=2)]
    scale = {"a": 2500.0, "b": 40.0, "c": 6000.0}
    for s in specs:
        _ack_all(p, 0.0, p.observe(0.0, ServiceSubmitted(s)))
    for k in range(1, 120):
        t = 30.0 * k
        s = specs[int(rng.integers(len(specs)))]
        rate = float(rng.uniform(0, 1) * scale[s.name])
        ds = p.observe(t, ServiceRateObserved(s.name, rate))
        pending = ds
        while pending:
            for d in pending:  # every drain keeps the ready, non-draining replicas covering
                if isinstance(d, DrainReplica):
                    st = p.services[d.service]
                    ready = sum(r.capacity for r in st.live() if r.ready)
                    assert ready + 1e-6 >= p.target(st)
                assert d.why and d.why.get("note")
            pending = _ack_all(p, t, pending)
        for st in p.services.values():
            assert st.covered() + 1e-6 >= p.target(st), (t, st.spec.name)
            assert spread_ok(list(st.replicas.values()))
        for g in p.gpus:  # slices on each GPU form a valid MIG layout
            from miso.mig import is_valid
            assert is_valid(p.gpus[g], [pl for _, _, pl in p.slots.held[g]])


def test_scale_in_hysteresis_does_not_flap_on_a_noisy_constant_rate():
    p = ServicePlanner({f"gpu{i}": "A100-40GB" for i in range(8)})
    spec = ServiceSpec("a", "x", "bert-large", 50, min_replicas=2)
    _ack_all(p, 0.0, p.observe(0.0, ServiceSubmitted(spec)))
    rng = np.random.default_rng(3)
    decisions = []
    for k in range(1, 241):  # two hours of 30 s windows at 1500/s +- 10 %
        t = 30.0 * k
        ds = p.observe(t, ServiceRateObserved("a", 1500.0 * float(rng.uniform(0.9, 1.1))))
        decisions += [(t, d) for d in ds]
        _ack_all(p, t, ds)
    late = [d for t, d in decisions if t > 900]
    assert late == [], [d.why["note"] for d in late]


def test_trend_boosts_only_a_rise_that_stands_out_of_the_noise():
    spec = ServiceSpec("a", "x", "bert-large", 50, min_replicas=2, headroom=0.0)
    p = ServicePlanner({f"gpu{i}": "A100-40GB" for i in range(8)},
                       PlannerConfig(lookback_s=30.0))
    p.observe(0.0, ServiceSubmitted(spec))
    for k, r in enumerate((1000.0, 1100.0, 950.0, 1080.0), 1):  # flat and noisy: no boost
        p.observe(30.0 * k, ServiceRateObserved("a", r))
    rate, slope = p.plan_rate(p.services["a"])
    assert slope > 0 and rate == pytest.approx(1080.0)
    q = ServicePlanner({f"gpu{i}": "A100-40GB" for i in range(8)},
                       PlannerConfig(lookback_s=30.0))
    q.observe(0.0, ServiceSubmitted(spec))
    for k, r in enumerate((1000.0, 1100.0, 1210.0, 1300.0), 1):  # a steady rise: boosted
        q.observe(30.0 * k, ServiceRateObserved("a", r))
    rate, slope = q.plan_rate(q.services["a"])
    assert rate > 1300.0 and rate <= 1300.0 * 1.25 + 1e-9


def test_traces_load_scale_and_compress(tmp_path):
    conv = azure_llm_trace("conv")
    assert len(conv.arrivals_s) == 19366 and conv.duration_s == pytest.approx(3501.7, abs=1)
    half = conv.compressed(2.0)
    assert half.duration_s == pytest.approx(conv.duration_s / 2)
    assert len(conv.scaled(2.5, seed=1).arrivals_s) == pytest.approx(2.5 * 19366, rel=0.02)
    csv = tmp_path / "t.csv"
    csv.write_text("timestamp,size\n10.5,3\n10.0,1\n12,\n")
    tr = load_trace(csv)
    assert list(tr.arrivals_s) == [0.0, 0.5, 2.0] and list(tr.sizes) == [1.0, 3.0, 1.0]
    js = tmp_path / "t.jsonl"
    js.write_text("\n".join(json.dumps({"timestamp": t}) for t in (3, 1, 2)))
    assert list(load_trace(js).arrivals_s) == [0.0, 1.0, 2.0]
    bad = tmp_path / "b.csv"
    bad.write_text("1\nnope\n")
    with pytest.raises(ValueError):
        load_trace(bad)
    day = diurnal_trace(10.0, 3600.0, 4.0, period_s=3600.0, seed=1)
    r = day.rate_per_window(300)
    assert 3.0 < r.max() / r.min() < 5.5 and math.isclose(r.mean(), 10.0, rel_tol=0.1)


def test_optimizer_keeps_replicas_and_packs_jobs_beside_them():
    from miso.mig import Placement, geometry
    from miso.optimize import optimizer_for
    from miso.replicasolve import solve_beside_replicas

    opt = optimizer_for(geometry("A100-40GB"))
    speeds = {"a": {"3g.20gb": 0.5, "4g.20gb": 0.6, "2g.10gb": 0.3},
              "b": {"1g.5gb": 0.2, "2g.10gb": 0.35}}
    sol = solve_beside_replicas(opt, speeds, {"r": Placement(0, "4g.20gb")})
    assert Placement(0, "4g.20gb") in sol.layout and set(sol.assignment) == {"a", "b"}
    assert sol.throughput == pytest.approx(0.5)  # a on 2g (0.3), b on 1g (0.2)
    assert all(pl.start >= 4 for pl in sol.assignment.values())


def test_services_file_parses_and_refuses_unknown_keys(tmp_path):
    from miso.sim.servicefile import load_services

    good = tmp_path / "s.yaml"
    good.write_text("window_s: 20\nservices:\n"
                    "  - {name: qa, owner: a, model: bert-large, slo_p99_ms: 50, "
                    "trace: azure:code, rate_multiplier: 2, compress: 4}\n"
                    "  - {name: d, owner: b, model: resnet50, slo_p99_ms: 10, "
                    "trace: 'diurnal:5', span_s: 600}\n")
    svcs, window = load_services(good)
    assert window == 20.0 and [s.name for s, _ in svcs] == ["qa", "d"]
    assert svcs[0][1].duration_s < 3436 / 4 + 1
    bad = tmp_path / "b.yaml"
    bad.write_text("services:\n  - {name: x, owner: a, model: bert-large, slo_p99_ms: 5, "
                   "trace: azure:code, command: rm}\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_services(bad)
    bad.write_text("services:\n  - {name: x, owner: a, model: gpt-9, slo_p99_ms: 5, "
                   "trace: azure:code}\n")
    with pytest.raises(ValueError, match="model"):
        load_services(bad)
