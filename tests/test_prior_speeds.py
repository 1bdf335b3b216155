"""The catalogue prior (:func:`miso.sched.speeds.prior_speeds`): the average catalogue speed per
profile that holds the job, 1.0 on the whole GPU, the harmonic mean never above the arithmetic."""

from __future__ import annotations

import pytest

from miso.mig import geometry
from miso.sched.policies.base import fitting_profiles
from miso.sched.speeds import prior_speeds, workload_speeds
from miso.workloads import catalogue

GEOM = geometry("A100-40GB")


@pytest.mark.parametrize("memory_gb", [2.2, 9.0, 17.5, 35.0])
def test_prior_holds_the_job_and_the_whole_gpu_is_one(memory_gb: float) -> None:
    got = prior_speeds(GEOM, memory_gb)
    assert set(got) == set(fitting_profiles(GEOM, memory_gb))  # the profiles placement allows
    assert got[GEOM.model.full_profile().name] == 1.0


def test_prior_is_the_catalogue_mean_and_harmonic_is_lower() -> None:
    arith, harm = prior_speeds(GEOM, 2.2), prior_speeds(GEOM, 2.2, harmonic=True)
    speeds = [workload_speeds(GEOM, w).get("1g.5gb") for w in catalogue().values()]
    seen = [s for s in speeds if s is not None]
    assert arith["1g.5gb"] == pytest.approx(sum(seen) / len(seen))
    assert harm["1g.5gb"] == pytest.approx(len(seen) / sum(1 / s for s in seen))
    assert all(harm[p] <= arith[p] + 1e-12 for p in arith)
    assert prior_speeds(GEOM, 80.0) == {}  # no profile holds it
