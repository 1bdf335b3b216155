"""The core's explicit parts: the policy table and its options, estimators by name, progress in
one unit, the one missing-level rule."""

from __future__ import annotations

import pytest

from miso.controller import Controller, ControllerConfig
from miso.controller.store import JobStore
from miso.mig import Placement, geometry
from miso.sched import (
    GpuAdded,
    JobProgress,
    JobSpec,
    JobSubmitted,
    NoisyOracle,
    PredictorEstimator,
    TrueSpeeds,
    make_policy,
    policy_names,
)
from miso.sched.clock import VirtualClock
from miso.sched.estimators import MpsProfileHeuristic, make_estimator
from miso.sched.policies import POLICIES, build_policy
from miso.sched.profiles import fill_missing_levels
from miso.sched.progress import full_gpu_work, slice_speed


def test_policy_table__lists_every_builtin_without_importing_for_side_effects():
    assert policy_names() == ["nopart", "optsta", "mps", "oracle", "miso", "miso+"]
    assert set(POLICIES) == set(policy_names())


def test_make_policy__an_unknown_option_is_an_error_naming_it():
    with pytest.raises(TypeError, match="'restart_pnalty'") as e:
        make_policy("miso", estimator=TrueSpeeds(), restart_pnalty=5.0)
    assert "restart_penalty" in str(e.value)        # the options it does take are listed
    with pytest.raises(TypeError, match="'slots'"):
        make_policy("nopart", slots=2)
    with pytest.raises(TypeError, match="'estimator'"):
        make_policy("oracle", estimator=TrueSpeeds())


def test_make_policy__a_missing_estimator_is_an_error_not_a_silent_oracle():
    for name in ("miso", "miso+"):
        with pytest.raises(TypeError, match="needs 'estimator'"):
            make_policy(name)
    assert make_policy("miso+", estimator=TrueSpeeds(), restart_s=30.0).restart_price("j") == 30.0


def test_build_policy__driver_defaults_only_where_taken_user_options_strict():
    d = {"estimator": TrueSpeeds(), "reprofile_cooldown_s": 5.0}
    assert build_policy("nopart", d).name == "nopart"
    assert build_policy("miso", d).cooldown == 5.0
    with pytest.raises(TypeError, match="'typo'"):
        build_policy("nopart", d, typo=1)


def test_make_estimator__one_vocabulary_for_both_drivers():
    assert isinstance(make_estimator("true"), TrueSpeeds)
    assert isinstance(make_estimator("noisy", seed=3), NoisyOracle)
    assert isinstance(make_estimator("heuristic"), MpsProfileHeuristic)
    a, b = make_estimator("unet"), make_estimator("predictor")
    assert isinstance(a, PredictorEstimator) and isinstance(b, PredictorEstimator)
    assert a.predictor is make_estimator("unet").predictor  # one loader, loaded once
    assert b.predictor is make_estimator("auto").predictor
    with pytest.raises(ValueError, match="unknown estimator 'unte'"):
        make_estimator("unte")


def test_progress__full_gpu_seconds_from_iterations_on_a_slice():
    geom = geometry("A100-40GB")
    three = Placement(4, "3g.20gb")
    # 300 iterations left at 2 it/s on a 3g slice that runs at 0.6 of the full GPU:
    # 150 s there, 90 s on the full GPU
    assert full_gpu_work(300, 2.0, 0.6) == pytest.approx(90.0)
    # speed measured (rates seen on 3g and on 7g) or else the slice's compute share
    assert slice_speed(geom, three, None, {"3g.20gb": 3.0, "7g.40gb": 5.0}) == 0.6
    assert slice_speed(geom, three, None, {}) == pytest.approx(3 / 7)
    assert slice_speed(geom, None, 50, {}) == 0.5
    with pytest.raises(ValueError):
        full_gpu_work(10, 0.0, 1.0)


def test_live_loop__a_progress_report_reaches_the_state_in_full_gpu_seconds():
    clock = VirtualClock()
    con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                     ControllerConfig(policy="nopart"), checkpoint_root="/nonexistent",
                     clock=clock)
    loop = con.loop
    loop.handle(("event", GpuAdded("g0", "A100-40GB")))
    rec = con.store.submit(command=["x"], name="a", memory_gb=4.0, memory_gib=4.0,
                           workload=None, at=0.0)
    loop.handle(("event", JobSubmitted(JobSpec(rec.id, "a", 4.0))))
    js = loop.state.jobs[rec.id]
    assert js.status.value == "placed" and js.gpu == "g0"   # nopart placed it
    assert js.remaining_work(0.0) is None                   # nothing reported yet
    full = Placement(0, "7g.40gb")
    loop.handle(("progress", rec.id, "g0", full, None, 400.0, 4.0))
    assert js.remaining_work(0.0) == pytest.approx(100.0)   # 400 it / 4 it/s, full GPU
    clock.advance(30.0)
    assert js.remaining_work(30.0) == pytest.approx(70.0)   # extrapolated at its speed
    loop.handle(("event", JobProgress(rec.id, 10.0, 1.0)))
    assert js.remaining_work(30.0) == pytest.approx(10.0)


def test_one_rule_for_a_level_without_a_reading():
    assert fill_missing_levels([10.0, 0.0, 4.0]) == (10.0, 4.0, 4.0)
    assert fill_missing_levels([None, 2.0]) == (2.0, 2.0)
    assert fill_missing_levels([float("nan"), 0.0]) == (1.0, 1.0)
