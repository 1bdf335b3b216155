"""Fair share on several GPU models (issue 30): entitlements in the usage's model-neutral unit,
and reclaim's timer never brings a decision back at the instant it was asked from."""

from __future__ import annotations

import pytest

from miso.sched import GpuAdded, JobSpec, JobSubmitted
from miso.sched.modelspeed import hardware_ratio
from miso.sched.state import ClusterState
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


def test_entitlements__in_the_model_neutral_unit_on_two_models():
    """1 A100-40GB + 1 H100-80GB (h = 2.61 A100-40GB GPUs): capacity 1 + h; owners 2:1 that
    both demand more get 2/3 and 1/3 of it; an owner's demand is counted in average GPUs
    ((1 + h) / 2 each). Counted in GPUs the 2:1 owners would get 4/3
    and 2/3 of 2 GPUs whatever models they held (measured: -23 % / +46 % of their weights)."""
    h = hardware_ratio("H100-80GB")
    st = ClusterState(TenancyConfig(weights={"u0": 2.0, "u1": 1.0}))
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    st.observe(0.0, GpuAdded("g1", "H100-80GB"))
    for i in range(8):
        st.observe(1.0, JobSubmitted(JobSpec(f"j{i}", "x", 5.0, owner=("u0", "u1")[i % 2])))
    ten = st.tenancy
    assert ten is not None
    assert ten.capacity() == pytest.approx(1.0 + h)
    assert ten.model_weight("H100-80GB") == pytest.approx(h)
    got = ten.entitlements({"u0": 4, "u1": 4}, demand_per_job=1.0)
    assert got == pytest.approx({"u0": 2 / 3 * (1 + h), "u1": 1 / 3 * (1 + h)})
    # u1 with one job demands one average GPU, (1 + h) / 2, more than its third: a third
    got = ten.entitlements({"u0": 4, "u1": 1}, demand_per_job=1.0)
    assert got["u1"] == pytest.approx((1 + h) / 3)
    got = ten.entitlements({"u0": 1, "u1": 1}, demand_per_job=1.0)
    assert got == pytest.approx({"u0": (1 + h) / 2, "u1": (1 + h) / 2})


class Bounded:
    """An observer that stops a run past ``limit`` events (a run that loops at one instant
    fails instead of hanging)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen = 0

    def on_event(self, now: float, ev: object, st: object) -> None:
        self.seen += 1
        if self.seen > self.limit:
            raise RuntimeError(f"more than {self.limit} events: stuck at t={now}")

    def on_decision(self, now: float, d: object, st: object) -> None:
        """Decisions are not counted (a loop at one instant shows in the events)."""


@pytest.mark.parametrize("min_run_s", [600.0, 600.1])
def test_reclaim__a_run_ends_within_a_bound_of_events_whatever_the_gap_rounds_to(
        min_run_s: float):
    """H fills 2 GPUs with 14 long jobs; L submits three at t = 1000, 1010, 1020, each owed a
    3g slice: reclaims return room to them, and one waits for a GPU's per-GPU gap
    (``min_run_s`` after 1000) on a reclaim timer. 1000 + 600.1 rounds so that the gap seen
    from the timer's instant is not yet over: reclaim asked for a timer at that same instant
    again, and the run never ended (as two of six two-owner cells on mixed models did). It
    ends, within the events of the gap that rounds exactly (117)."""
    jobs = [TraceJob(f"h{i:02d}", float(i), 20000.0, "resnet_train64", "H") for i in range(14)]
    jobs += [TraceJob(f"l{k}", 1000.0 + 10 * k, 2000.0, "resnet_train64", "L")
             for k in range(3)]
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=2), tenancy=TenancyConfig(
        min_run_s=min_run_s), observer=lambda _: Bounded(1000))
    assert r.reclaims >= 3
    assert r.events <= 150
    assert len(r.finish) == len(jobs)
