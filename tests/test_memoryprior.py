"""miso+'s ``memory_prior`` (issue 19, item 5): unprofiled jobs get the slice curve of catalogue
workloads of similar memory, never of their own model family."""

from __future__ import annotations

import pytest

from miso.mig import geometry
from miso.sched import GpuAdded, JobSpec, JobSubmitted, make_policy
from miso.sched.estimators import NoisyOracle
from miso.sched.experiments import MemoryPrior
from miso.sched.memoryprior import memory_prior
from miso.sched.policies.base import Scratch
from miso.sched.speeds import prior_speeds, workload_speeds
from miso.sched.state import ClusterState
from miso.workloads import catalogue, family_of

GEOM = geometry("A100-40GB")


def test_large_jobs_get_the_slow_small_slices_of_large_workloads():
    base = prior_speeds(GEOM, 17.5)
    got = memory_prior(GEOM, base, 17.5, "newmodel_train1")
    assert set(got) == set(base) and got["7g.40gb"] == 1.0
    # every catalogue workload above 9 GB runs 3g at 0.49-0.56 of the full GPU
    assert 0.45 < got["3g.20gb"] < 0.6 < base["3g.20gb"]
    small = memory_prior(GEOM, prior_speeds(GEOM, 2.2), 2.2, "newmodel_train1")
    assert small["3g.20gb"] > got["3g.20gb"] + 0.2


def test_own_family_left_out():
    # bert_train8 is the only workload at 18.2 GB; the nearest others are at 17.5 GB
    # (cyclegan_train4, transformer_train128). A narrow kernel gives a new family bert's
    # curve, and bert itself a mix of the two others: never its own.
    cat = {n: workload_speeds(GEOM, catalogue()[n])
           for n in ("bert_train8", "cyclegan_train4", "transformer_train128")}
    base = prior_speeds(GEOM, 18.2)
    new = memory_prior(GEOM, base, 18.2, "newmodel_train1", sigma=0.01)
    own = memory_prior(GEOM, base, 18.2, "bert_train8", sigma=0.01)
    assert family_of("bert_train8") == "bert"
    for p in ("3g.20gb", "4g.20gb"):
        assert new[p] == pytest.approx(cat["bert_train8"][p], abs=1e-3)
        lo, hi = sorted((cat["cyclegan_train4"][p], cat["transformer_train128"][p]))
        assert lo - 1e-9 <= own[p] <= hi + 1e-9  # a mix of the two others only
    assert own["3g.20gb"] < cat["bert_train8"]["3g.20gb"] - 0.005
    with pytest.raises(ValueError):
        memory_prior(GEOM, base, 18.2, "bert_train8", sigma=0.0)


@pytest.mark.parametrize("on", [False, True])
def test_misoplus_plans_unprofiled_jobs_with_the_memory_prior(on):
    st = ClusterState()
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    st.observe(0.0, JobSubmitted(JobSpec("a", "a", 17.5, "newmodel_train1")))
    pol = make_policy("miso+", estimator=NoisyOracle(seed=0),
                      estimates=(MemoryPrior(),) if on else ())
    got = pol.speeds(GEOM, Scratch(st), ["a"])["a"]
    assert got["3g.20gb"] == pytest.approx(
        memory_prior(GEOM, prior_speeds(GEOM, 17.5), 17.5, "newmodel_train1")["3g.20gb"]
        if on else prior_speeds(GEOM, 17.5)["3g.20gb"])
