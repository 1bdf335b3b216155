"""Issue 31: the accounts' fair-share figure (``miso.sim.fairness.account_shares``) on a
hand-made run: the three windows give the hand-computed shares."""

from __future__ import annotations

import numpy as np
import pytest

from miso.sim.fairness import account_shares
from miso.sim.result import SimResult

ACCOUNTS = {"a1": "A", "b1": "B"}


def _run() -> SimResult:
    """A's jobs x (0-100, started at once) and y (waits 0-50, ends 150); B's z (waits 0-30,
    ends 120) and w (submitted 60, waits until 80, ends 140). GPUs held: A 3 / B 1 from 0,
    2 / 2 from 30, 1 / 3 from 60, 1 / 1 from 90, nothing from 150."""
    return SimResult(
        policy="hand", job_ids=["x", "y", "z", "w"],
        submit=np.array([0.0, 0.0, 0.0, 60.0]), finish=np.array([100.0, 150.0, 120.0, 140.0]),
        duration=np.array([100.0, 100.0, 90.0, 60.0]), restarts=np.zeros(4), busy_gpu_s=0.0,
        n_gpus=4, events=0, decisions=0, owners=["a1", "a1", "b1", "b1"],
        first_start=np.array([0.0, 50.0, 30.0, 80.0]),
        owner_usage=[(0.0, {"a1": 3.0, "b1": 1.0}), (30.0, {"a1": 2.0, "b1": 2.0}),
                     (60.0, {"a1": 1.0, "b1": 3.0}), (90.0, {"a1": 1.0, "b1": 1.0}),
                     (150.0, {})])


def test_account_shares__waiting_counts_only_the_moments_every_account_has_a_job_waiting():
    # both wait only in [0, 30) (A until 50; B until 30, then again 60-80): A 3 x 30 = 90
    # GPU-s, B 1 x 30 = 30
    assert account_shares(_run(), ACCOUNTS, waiting=True)["A"] == pytest.approx(90 / 120)


def test_account_shares__the_horizon_windows_count_times_an_account_had_nothing_waiting():
    r = _run()
    # until A's last first start (50 < B's 80): A 90 + 2 x 20 = 130, B 30 + 2 x 20 = 70
    assert account_shares(r, ACCOUNTS, queued=True)["A"] == pytest.approx(130 / 200)
    # until B's last job ended (140 < A's 150): A 90 + 60 + 30 + 50 = 230, B 30 + 60 + 90 +
    # 50 = 230
    assert account_shares(r, ACCOUNTS)["A"] == pytest.approx(0.5)
