"""miso+ on two GPU models: moves onto an idle faster GPU and swaps at arrival
(miso.sched.modelplace), hand-computed; estimates carried across models."""

from __future__ import annotations

import pytest

from miso.mig import geometry
from miso.sched import PlaceJob, RequeueJob
from miso.sched.modelplace import for_geometry, relative_speed
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig

# sched/modelspeed.py: deepspeech2_train8/16 gain the whole hardware ratio on an H100-80GB
# (2.6132); resnet_train512 gains 1.554 (p = 0.418 from its 1g A100 speed).
F_DS = relative_speed("deepspeech2_train8", "H100-80GB", "A100-40GB")
F_RN = relative_speed("resnet_train512", "H100-80GB", "A100-40GB")
CFG = WorldConfig(gpu_mix=(("A100-40GB", 1), ("H100-80GB", 1)), n_gpus=2, reconfig_s=0.0,
                  restart_s=0.0, predictor="true")


def _run(jobs, aware=True):
    r = run_policy("miso+", jobs, CFG, 1, record=True, model_aware=aware)
    moves = [(t, d.job) for t, d in r.log if isinstance(d, RequeueJob)]
    places = [(t, d.job, d.gpu) for t, d in r.log if isinstance(d, PlaceJob)]
    return dict(zip(r.job_ids, r.jct, strict=True)), moves, places


def test_factors_as_the_hand_computation_uses_them():
    assert abs(F_DS - 2.6132) < 1e-4
    assert relative_speed("deepspeech2_train16", "H100-80GB", "A100-40GB") == F_DS
    assert abs(F_RN - 1.554) < 1e-3
    assert relative_speed(None, "H100-80GB", "A100-40GB") == 1.0  # unknown: blind


def test_idle_h100_takes_the_job_running_alone_on_the_a100():
    # x (1,000 s on the H100) takes the H100 at t = 0; b (1,554 s of work: 1,000 s on the
    # H100) comes at t = 1 and takes the idle A100: a swap would cost x 2,610.6 - 999 = 1,611.6 s
    # for b's 554 s, so none. At t = 1,000 x ends and the H100 idles: b has 555 s of work
    # left (1.0 on the A100) and moves (555 / 1.554 = 357.1 s there): b ends at 1,357.1.
    work_b = 1000.0 * F_RN
    jobs = [TraceJob("x", 0.0, 1000.0 * F_DS, "deepspeech2_train16"),
            TraceJob("b", 1.0, work_b, "resnet_train512")]
    jct, moves, places = _run(jobs)
    assert (0.0, "x", "gpu1") in places and (1.0, "b", "gpu0") in places
    assert moves == [(pytest.approx(1000.0, rel=1e-6), "b")]
    left = work_b - 999.0
    assert jct["x"] == pytest.approx(1000.0, rel=1e-6)
    assert jct["b"] == pytest.approx(999.0 + left / F_RN, rel=1e-4)
    # Blind to the model, b stays on the A100 (nothing shares a GPU: no donor) and the
    # first job takes the first GPU (the A100)
    jct_blind, moves_blind, _ = _run(jobs, aware=False)
    assert moves_blind == []
    assert sum(jct.values()) < sum(jct_blind.values())


def test_arrival_swaps_with_a_short_job_alone_on_the_h100():
    # x (100 s on the H100) runs there from t = 0; b (1,000 s on the H100, 2,613.2 s on the
    # A100) comes at t = 1 to the idle A100. x loses 258.7 - 99.0 = 159.7 s on the A100, b
    # gains 1,613.2 s on the H100: they swap. x ends at 1 + 258.7 = 259.7; b at 1,001.
    jobs = [TraceJob("x", 0.0, 100.0 * F_DS, "deepspeech2_train16"),
            TraceJob("b", 1.0, 1000.0 * F_DS, "deepspeech2_train8")]
    jct, moves, places = _run(jobs)
    assert moves == [(1.0, "x")]
    assert (1.0, "b", "gpu1") in places and (1.0, "x", "gpu0") in places
    assert jct["x"] == pytest.approx(1.0 + 100.0 * F_DS - F_DS, rel=1e-4)
    assert jct["b"] == pytest.approx(1000.0, rel=1e-4)


def test_estimates_follow_a_job_to_another_model_by_compute_slices():
    a100, h100 = geometry("A100-40GB"), geometry("H100-80GB")
    est = {"7g.40gb": 1.0, "4g.20gb": 0.8, "3g.20gb": 0.7, "2g.10gb": 0.5, "1g.5gb": 0.3}
    assert for_geometry(est, a100) is est  # same model: the same estimates
    moved = for_geometry(est, h100)
    assert moved == {"7g.80gb": 1.0, "4g.40gb": 0.8, "3g.40gb": 0.7, "2g.20gb": 0.5,
                     "1g.10gb": 0.3}
