"""The one MPS speed model (miso.mps_speed): what the simulator and the emulated workload share."""

from __future__ import annotations

import numpy as np
import pytest

from miso import emuworkload
from miso.mps_speed import PROFILE_LEVELS, measured_profile, mix_speeds, mps_speed
from miso.sim.world import WorldConfig
from miso.workloads import catalogue


def test_alone_at_full_level_is_full_speed_and_fewer_threads_not_faster():
    for name in ("bert_train8", "mobilenet_train64", "cyclegan_train4", "embedding_train64"):
        assert mps_speed(name, 100, 1) == pytest.approx(1.0)
        v = [mps_speed(name, lv, 1) for lv in PROFILE_LEVELS]
        assert v[0] >= v[1] >= v[2] > 0


def test_heavier_jobs_slow_down_more_on_fewer_threads():
    assert mps_speed("bert_train8", 14, 1) < mps_speed("mobilenet_train64", 14, 1)


def test_more_co_runners_not_faster():
    for lv in PROFILE_LEVELS:
        speeds = [mps_speed("gnn_train128", lv, n) for n in range(1, 8)]
        assert all(b <= a for a, b in zip(speeds, speeds[1:], strict=False))


def test_mps_only_shares_follow_the_share_times_the_penalty():
    """An MPS-only GPU (3 jobs at 33 %): the SM share alone, slowed 0.15 per extra job."""
    w = catalogue()["resnet_train64"]
    assert mps_speed(w.name, 33, 3) == pytest.approx(w.speed_at(7 * 0.33) / 1.3)


def test_emulated_workload_runs_at_the_simulators_speed():
    """The emulated workload and the simulator read one model: same speed for the same mix."""
    co = [("bert_train2", 50.0), ("gnn_train64", 50.0)]
    sim = mix_speeds(["resnet_train128", "bert_train2", "gnn_train64"], [50],
                     WorldConfig().mps_penalty)[0][0]
    assert emuworkload.mps_speed("resnet_train128", 50, co) == sim
    assert emuworkload.mps_speed("resnet_train128", 100, []) == pytest.approx(1.0)


def test_measured_profile_shape_noise_and_errors():
    names = ["bert_train8", "gnn_train64"]
    exact = measured_profile(names)
    assert exact.shape == (3, 2) and (exact > 0).all() and (exact <= 1.0).all()
    np.testing.assert_array_equal(
        exact[:, 0], mix_speeds(names, PROFILE_LEVELS)[0])
    a = measured_profile(names, np.random.default_rng(1))
    np.testing.assert_array_equal(a, measured_profile(names, np.random.default_rng(1)))
    assert not np.array_equal(a, exact)
    np.testing.assert_array_equal(measured_profile(names, np.random.default_rng(1), noise=0.0),
                                  exact)
    with pytest.raises(ValueError):
        measured_profile([])
    with pytest.raises(KeyError):
        measured_profile(["no_such_job"])
    with pytest.raises(ValueError):
        mps_speed("bert_train8", 0, 1)
    with pytest.raises(ValueError):
        mps_speed("bert_train8", 50, 0)
