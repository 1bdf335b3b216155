"""The Philly part of benchmarks/sim/tenancy.py splits each vc's average JCT into where it
went (issue 31: which vcs exceed a sharing incentive of 1.5, and why): the parts add up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import load_script

from miso.sim.result import SimResult

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sim" / "tenancy.py"


def _bench():  # noqa: ANN202
    return load_script("tenancy_bench", SCRIPT)


def test_jct_parts__waits_and_running_time_add_up_to_the_owners_average_jct() -> None:
    # owner a: a one-GPU job waiting 10 s then running 90 s, a gang waiting 300 s then
    # running 100 s (2 restarts); owner b's job is not counted
    r = SimResult(policy="p", job_ids=["1", "2", "3"], submit=np.array([0.0, 0.0, 5.0]),
                  finish=np.array([100.0, 400.0, 50.0]), duration=np.array([90.0, 100.0, 45.0]),
                  restarts=np.array([0, 2, 1]), busy_gpu_s=0.0, n_gpus=4, events=0,
                  decisions=0, owners=["a", "a", "b"],
                  first_start=np.array([10.0, 300.0, 5.0]), num_gpus=np.array([1, 2, 1]))
    w1, wg, run, rs = _bench().jct_parts(r, "a")
    assert (w1, wg, run, rs) == pytest.approx((5.0, 150.0, 95.0, 1.0))
    assert w1 + wg + run == pytest.approx(float(r.jct[:2].mean()))
