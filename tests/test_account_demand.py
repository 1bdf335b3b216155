"""Issue 31, accounts: a waiting job is demand not met. With accounts, an owner with jobs
waiting demands at least what it holds plus their smallest slices
(:func:`miso.sched.fairfill.floored`), so an account of a few jobs that need more than a fair
slice stays entitled to its weighted share while they wait; hand-computed entitlements."""

from __future__ import annotations

import pytest

from miso.sched import GpuAdded, JobSpec, JobSubmitted
from miso.sched.fairfill import floored
from miso.sched.state import ClusterState
from miso.sched.tenancy import two_level_fill
from miso.sched.tenancyconfig import TenancyConfig

ACCOUNTS = {"a1": "A", "b1": "B"}
WEIGHTS = {"A": 2.0, "B": 1.0}


def test_floored__raises_only_owners_with_jobs_waiting_to_what_they_hold_plus_their_needs():
    demand = {"a1": 8.0, "b1": 1.5, "c1": 1.0}
    got = floored(demand, {"a1": 3.0, "b1": 1.0, "c1": 2.0}, {"a1": 0.5, "b1": 1.25})
    # a1: 3 + 0.5 under its 8: 8; b1: 1 + 1.25 = 2.25 over its 1.5; c1 waits for nothing: 1
    assert got == pytest.approx({"a1": 8.0, "b1": 2.25, "c1": 1.0})
    # B's 2.25 now exceeds its third of 6 GPUs: it gets 2, A the other 4 (was 1.5 / 4.5)
    cfg = TenancyConfig(accounts=ACCOUNTS, account_weights=WEIGHTS)
    assert two_level_fill(6.0, {"a1": 8.0, "b1": 2.25}, cfg) == pytest.approx(
        {"a1": 4.0, "b1": 2.0})
    assert two_level_fill(6.0, {"a1": 8.0, "b1": 1.5}, cfg) == pytest.approx(
        {"a1": 4.5, "b1": 1.5})


def _entitlements(cfg: TenancyConfig, b_memory_gb: float) -> dict[str, float]:
    """6 A100-40GB, nothing placed; a1 queues 30 jobs of 5 GB (a 1g slice each), b1 five of
    ``b_memory_gb``; entitlements at 2/7 of a GPU demanded per job."""
    st = ClusterState(cfg)
    for g in range(6):
        st.observe(0.0, GpuAdded(f"g{g}", "A100-40GB"))
    for i in range(30):
        st.observe(1.0, JobSubmitted(JobSpec(f"a{i}", "x", 5.0, owner="a1")))
    for i in range(5):
        st.observe(2.0, JobSubmitted(JobSpec(f"b{i}", "x", b_memory_gb, owner="b1")))
    ten = st.tenancy
    assert ten is not None
    return ten.entitlements({"a1": 30, "b1": 5}, demand_per_job=2 / 7)


def test_accounts__waiting_jobs_that_need_3g_keep_their_account_entitled_to_its_weight():
    """B's five 17.5 GB jobs need a 3g slice (3/7) each: 15/7 GPUs, more than their 5 x 2/7 =
    10/7 by the fair slice and more than B's third of 6 GPUs: B is entitled to 2, A to 4.
    Five 1g jobs (5 GB: 1/7 each, 5/7 together) demand their 10/7: B 10/7, A the rest.
    Without accounts (one level) the demand stays 10/7 either way."""
    cfg = TenancyConfig(accounts=ACCOUNTS, account_weights=WEIGHTS)
    assert _entitlements(cfg, 17.5) == pytest.approx({"a1": 4.0, "b1": 2.0})
    assert _entitlements(cfg, 5.0) == pytest.approx({"a1": 6 - 10 / 7, "b1": 10 / 7})
    flat = TenancyConfig(weights={"a1": 2.0})
    assert _entitlements(flat, 17.5) == pytest.approx({"a1": 6 - 10 / 7, "b1": 10 / 7})
