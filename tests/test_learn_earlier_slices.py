"""miso+'s ``learn_earlier_slices`` (issue 19, item 4): a job planned with the catalogue prior
learns the speed of the slices it ran on before its full-GPU rate was known."""

from __future__ import annotations

import pytest

from miso.mig import Placement, geometry
from miso.sched import GpuAdded, JobSpec, JobSubmitted, SpeedObserved, make_policy
from miso.sched.estimators import NoisyOracle
from miso.sched.experiments import LearnEarlierSlices, earlier_slice_speeds
from miso.sched.policies.base import Scratch
from miso.sched.state import ClusterState

GEOM = geometry("A100-40GB")


def test_earlier_slice_speeds_divides_by_the_full_gpu_rate():
    got = earlier_slice_speeds({"3g.20gb": 5.0, "7g.40gb": 10.0, "1g.5gb": 30.0}, 10.0,
                               "7g.40gb")
    assert got == {"3g.20gb": pytest.approx(0.5), "1g.5gb": pytest.approx(1.5)}  # clipped
    assert earlier_slice_speeds({"3g.20gb": 5.0}, 0.0, "7g.40gb") == {}


@pytest.mark.parametrize("on", [False, True])
def test_slice_seen_before_the_full_gpu_becomes_a_speed(on):
    st = ClusterState()
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    st.observe(0.0, JobSubmitted(JobSpec("a", "a", 4.0, "bert_train8")))
    pol = make_policy("miso+", estimator=NoisyOracle(seed=0),
                      estimates=(LearnEarlierSlices(),) if on else ())
    prior = pol.speeds(GEOM, Scratch(st), ["a"])["a"]  # never profiled: the prior
    # first on a 3g slice (no full-GPU rate yet: a raw rate, no speed), then alone on 7g
    for t, prof, rate in ((1.0, "3g.20gb", 5.0), (2.0, "7g.40gb", 10.0)):
        ev = SpeedObserved("a", "g0", Placement(0, prof), rate)
        st.observe(t, ev)
        pol.on_speed_observed(t, ev, Scratch(st))
    got = pol.speeds(GEOM, Scratch(st), ["a"])["a"]
    assert got["3g.20gb"] == pytest.approx(0.5 if on else prior["3g.20gb"])
    assert got["4g.20gb"] == pytest.approx(prior["4g.20gb"])  # never ran there
    # a slice seen after the full-GPU rate is learned either way
    ev = SpeedObserved("a", "g0", Placement(0, "4g.20gb"), 6.0)
    st.observe(3.0, ev)
    pol.on_speed_observed(3.0, ev, Scratch(st))
    assert pol.speeds(GEOM, Scratch(st), ["a"])["a"]["4g.20gb"] == pytest.approx(0.6)
