"""Issue 31: load-aware fair slices with a stated price, reclaim only when it buys something,
and accounts above owners (two-level fair share)."""

from __future__ import annotations

import math

import pytest

from miso.sched import GpuAdded, JobSpec, JobSubmitted
from miso.sched.fairprice import (
    Backlog,
    FairBudget,
    estimated_price,
    fair_cap,
    fair_fraction,
    packed_share,
)
from miso.sched.state import ClusterState
from miso.sched.tenancy import two_level_fill
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.fairness import account_shares
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig

A100 = [c / 7 for c in (1, 2, 3, 4, 7)]


def test_fair_cap__whole_gpu_without_backlog_smaller_slices_as_the_backlog_grows():
    # not backlogged (at most one active job per GPU): what the owner has alone, a whole GPU
    assert fair_cap(0.05, 0.9, A100).cap == 1.0 and not fair_cap(0.05, 0.9, A100).backlogged
    # 2.7 jobs per GPU (1.6x load): packed share 1.5 / 2.7 = 0.556; a 4g slice (4/7 = 0.571)
    # costs 0.335 x 1 x 0.016 = 0.5 %, the whole GPU 0.335 x 0.444 = 15 %: 4g, and no part of
    # the jobs on the next size (the cap still follows the pressure here)
    b = fair_cap(0.05, 2.7, A100)
    assert b.backlogged and b.cap == pytest.approx(4 / 7) and b.share == 0.0
    assert b.price_est == pytest.approx(0.335 * (4 / 7 - 1.5 / 2.7))
    # 15 per GPU (saturated): packed share the 1g slice; 2g costs 0.335 x 1/7 = 4.8 %, 3g
    # 9.6 %: 2g, and what is left of the price (0.2 %) buys 3g for 0.2 / 4.8 of the jobs
    b = fair_cap(0.05, 15.0, A100)
    assert b.cap == pytest.approx(2 / 7) and b.up == pytest.approx(3 / 7)
    assert b.share == pytest.approx((0.05 - 0.335 / 7) / (0.335 / 7))
    assert b.price_est == pytest.approx(0.05)
    assert b.mean == pytest.approx(2 / 7 + b.share / 7)
    assert fair_cap(0.10, 15.0, A100).cap == pytest.approx(3 / 7)
    # a price of 0 leaves the smallest slice (fair share orders the queue only)
    b = fair_cap(0.0, 15.0, A100)
    assert b.cap == pytest.approx(1 / 7) and b.share == 0.0 and b.mean == pytest.approx(1 / 7)
    # the estimate grows from nothing at 1 job per GPU to all of SLOPE at 2
    assert estimated_price(1.0, 1.0) == 0.0
    assert estimated_price(1.0, 1.5) == pytest.approx(0.335 * 0.5 * (1 - 1.0))
    assert packed_share(3.0, 1 / 7) == pytest.approx(0.5)
    assert packed_share(30.0, 1 / 7) == pytest.approx(1 / 7)


def test_fair_budget__a_share_of_the_jobs_on_the_next_size_picked_stably_per_job():
    b = FairBudget(15.0, True, 2 / 7, 0.05, 0.05, up=3 / 7, share=0.25)
    names = [f"job-{i}" for i in range(4000)]
    up = [n for n in names if b.cap_of(n) == pytest.approx(3 / 7)]
    assert len(up) / len(names) == pytest.approx(0.25, abs=0.03)
    assert {b.cap_of(n) for n in names} == {2 / 7, 3 / 7}
    # a job keeps its cap from one decision to the next (a stable hash, not a draw)
    assert [b.cap_of(n) for n in up] == [b.cap_of(n) for n in up]
    assert FairBudget(15.0, True, 2 / 7, 0.04, 0.05).cap_of("job-1") == pytest.approx(2 / 7)


def test_fair_fraction__each_job_its_own_cap_cut_by_the_entitlement_per_job():
    # one cap for every job: the smaller of it and the entitlement per job
    assert fair_fraction(4 / 7, 4 / 7, 0.5) == pytest.approx(0.5)
    assert fair_fraction(4 / 7, 4 / 7, 0.9) == pytest.approx(4 / 7)
    # caps 2/7 and 3/7, mean 0.3: an entitlement per job of 0.3 or more gives each its own
    assert fair_fraction(3 / 7, 0.3, 0.3) == pytest.approx(3 / 7)
    assert fair_fraction(2 / 7, 0.3, 0.5) == pytest.approx(2 / 7)
    # short of it: the smaller of the cap and the entitlement per job (2g stays 2g)
    assert fair_fraction(3 / 7, 0.3, 0.29) == pytest.approx(0.29)
    assert fair_fraction(2 / 7, 0.3, 0.29) == pytest.approx(2 / 7)


def test_backlog__exact_exponential_average_of_a_piecewise_constant_count():
    b = Backlog(tau_s=100.0)
    b.sample(0.0, 0, 4)
    b.sample(0.0, 8, 4)          # 2 jobs per GPU from t=0
    got = b.sample(100.0, 8, 4)
    assert got == pytest.approx(2.0 * (1 - math.exp(-1.0)))
    b.sample(100.0, 4, 4)        # 1 per GPU from t=100
    assert b.sample(300.0, 4, 4) == pytest.approx(1.0 + (got - 1.0) * math.exp(-2.0))
    assert b.mean() == pytest.approx((2.0 * 100 + 1.0 * 200) / 300)


def test_accounts__two_level_entitlements_hand_computed():
    """12 GPUs; account A (weight 2) holds a1 (1), a2 (1), a3 (2); account B (weight 1)
    holds b1. Every owner demands more than the cluster: A gets 12 x 2/3 = 8, B 4; inside A,
    a1 8 x 1/4 = 2, a2 2, a3 8 x 2/4 = 4."""
    cfg = TenancyConfig(accounts={"a1": "A", "a2": "A", "a3": "A", "b1": "B"},
                        account_weights={"A": 2.0, "B": 1.0}, weights={"a3": 2.0})
    got = two_level_fill(12.0, {"a1": 20.0, "a2": 20.0, "a3": 20.0, "b1": 20.0}, cfg)
    assert got == pytest.approx({"a1": 2.0, "a2": 2.0, "a3": 4.0, "b1": 4.0})
    # a1 needs 1 GPU only: A's 8 are shared again: a2 8-1 = 7 x 1/3, a3 x 2/3
    got = two_level_fill(12.0, {"a1": 1.0, "a2": 20.0, "a3": 20.0, "b1": 20.0}, cfg)
    assert got == pytest.approx({"a1": 1.0, "a2": 7 / 3, "a3": 14 / 3, "b1": 4.0})
    # B needs 1 GPU: A takes the other 11
    got = two_level_fill(12.0, {"a1": 20.0, "a2": 20.0, "a3": 20.0, "b1": 1.0}, cfg)
    assert got["b1"] == pytest.approx(1.0) and sum(got.values()) == pytest.approx(12.0)
    # without accounts every owner is its own account: one level, as before
    flat = TenancyConfig(weights={"a3": 2.0})
    assert two_level_fill(12.0, {"a1": 20.0, "a3": 20.0}, flat) == \
        pytest.approx({"a1": 4.0, "a3": 8.0})


ACCOUNTS = {"a1": "A", "a2": "A", "a3": "A", "b1": "B"}


def test_accounts__the_queue_goes_by_account_first_then_by_owner_within_it():
    """Usage a1 4, a2 0, b1 3 GPU-s; A weight 2, B weight 1: A's level (4 + 0) / 2 = 2 is below
    B's 3 / 1, so A's owners go first, a2 (0) before a1 (4), then b1. Without accounts: a2, b1,
    a1 (each owner its own level)."""
    def order(cfg: TenancyConfig) -> list[str]:
        st = ClusterState(cfg)
        st.observe(0.0, GpuAdded("g0", "A100-40GB"))
        for i, o in enumerate(("a1", "b1", "a2")):
            st.observe(float(i), JobSubmitted(JobSpec(f"j-{o}", "x", 5.0, owner=o)))
        ten = st.tenancy
        assert ten is not None
        ten.usage.update({"a1": 4.0, "a2": 0.0, "b1": 3.0})
        return ten.order(st.queue)

    two = TenancyConfig(accounts=ACCOUNTS, account_weights={"A": 2.0, "B": 1.0})
    assert order(two) == ["j-a2", "j-a1", "j-b1"]
    assert order(TenancyConfig()) == ["j-a2", "j-b1", "j-a1"]


@pytest.mark.slow
def test_accounts__a_saturated_run_shares_gpu_time_by_account_weight():
    """A saturated cluster (4 GPUs, 160 long jobs at once, each user a quarter): account A
    (weight 2, users a1 a2 a3) holds 2/3 of the GPU time and B (weight 1, user b1) 1/3, within
    5 %, while both have jobs waiting, although A has three times B's jobs."""
    jobs = [TraceJob(f"j{i:03d}", float(i), 1800.0, "resnet_train64",
                     ("a1", "a2", "a3", "b1")[i % 4]) for i in range(160)]
    ten = TenancyConfig(accounts=ACCOUNTS, account_weights={"A": 2.0, "B": 1.0})
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=4), 1, tenancy=ten)
    # measured 2026-12-02: A 0.687 while both had jobs waiting; 0.715 until B's last job
    # ended (B's last jobs run on small slices beside A's: its demand is under its share)
    assert account_shares(r, ACCOUNTS, queued=True)["A"] == pytest.approx(2 / 3, rel=0.05)
    assert account_shares(r, ACCOUNTS)["A"] == pytest.approx(2 / 3, rel=0.08)


def test_hold__a_waiting_owner_below_its_share_keeps_a_gpu_from_the_others_new_jobs():
    """One A100; H fills it with seven 1g jobs and keeps submitting more; L (below its
    entitlement) submits a job that needs a 3g slice. Reclaim is kept out (``min_run_s``
    longer than the run), so only the hold acts: no H job submitted after L's starts before
    it (without the hold every one of them takes the 1g slices that free, and L waits
    until H stops submitting)."""
    jobs = [TraceJob(f"h{i}", float(i), 3000.0 + 400 * i, "mobilenet_train64", "H")
            for i in range(7)]
    jobs.append(TraceJob("l", 100.0, 2000.0, "transformer_train128", "L"))
    jobs += [TraceJob(f"m{i:02d}", 200.0 + 300 * i, 3000.0, "mobilenet_train64", "H")
             for i in range(20)]
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=1), 1,
                   tenancy=TenancyConfig(min_run_s=1e6))
    start = dict(zip(r.job_ids, (float(x) for x in r.first_start), strict=True))
    assert r.reclaims == 0
    assert [j for j in start if j.startswith("m") and start[j] < start["l"]] == []
    # L waited only for three of H's first jobs to end (3,000-3,800 s), not for H's stream
    assert start["l"] < 5000.0


def _flood() -> tuple[list[TraceJob], WorldConfig]:
    """Heavy owner H fills 2 GPUs with 14 long jobs; light owner L submits one at t=1000."""
    jobs = [TraceJob(f"h{i:02d}", float(i), 20000.0, "resnet_train64", "H") for i in range(14)]
    jobs.append(TraceJob("l", 1000.0, 2000.0, "resnet_train64", "L"))
    return jobs, WorldConfig(n_gpus=2)


def test_reclaim__only_when_the_fair_slice_beats_the_packed_share():
    """L's job is owed a 3g slice (0.5 of a GPU) where packing gives 1/7: room is reclaimed,
    and L's job then runs on more than its packed share (no reclaim leaves its job no
    faster). Owed only a 1g slice (``demand_per_job`` 1/7), which packing gives anyway:
    nothing is reclaimed."""
    from miso.sched import RequeueJob

    jobs, cfg = _flood()
    on = run_policy("miso+", jobs, cfg, record=True, tenancy=TenancyConfig(min_run_s=600.0))
    assert on.reclaims >= 1 and on.reclaim_events == 1 and on.reclaims_useless == 0
    why = [d.why for _, d in on.log if isinstance(d, RequeueJob) and d.why
           and d.why.get("trigger") == "reclaim"]
    assert why and all(w["for_job"] == "l" and w["fair_slice"] > w["packed_share"]
                       for w in why)
    assert why[0]["packed_share"] == pytest.approx(1 / 7)
    small = run_policy("miso+", jobs, cfg, tenancy=TenancyConfig(min_run_s=600.0,
                                                                 demand_per_job=1 / 7))
    assert small.reclaims == 0 and small.reclaims_useless == 0



def test_reclaim__the_job_keeps_the_fair_slice_its_room_was_returned_for_until_it_starts():
    """A reclaim's promise (``FairSlices.promised``): a queued job owed 3g by a reclaim keeps
    3g or larger however its owner's entitlement per job moves before it starts (here its owner
    is above its entitlement: without the promise nothing would be owed); another job of the
    same owner is owed nothing, and the promise goes when the job starts."""
    from miso.sched.policies.base import Scratch

    st = ClusterState(TenancyConfig(demand_per_job=0.5))
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    for i in range(12):
        st.observe(float(i), JobSubmitted(JobSpec(f"a{i}", "x", 5.0, owner="a")))
    ten = st.tenancy
    assert ten is not None
    ten.held["a"] = 5.0             # far above its one GPU: not protected
    geom = st.gpus["g0"].geom
    assert Scratch(st).fair.fair_slices(geom, "a", "a0") is None
    ten.slices.promised["a0"] = 3 / 7
    sc = Scratch(st)
    assert sc.fair.fair_slices(geom, "a", "a0") == {"3g.20gb", "4g.20gb", "7g.40gb"}
    assert sc.fair.fair_slices(geom, "a", "a1") is None


def test_fair_slices__with_a_share_each_job_is_owed_its_own_cap():
    """A budget of 2g with a share of the jobs on 3g (saturated, ``fairness_price``): an owner
    whose entitlement per job covers the mean cap (8 jobs of about 0.39 of a GPU, within its
    4 GPUs) owes each job its own cap."""
    from miso.sched.policies.base import Scratch

    st = ClusterState(TenancyConfig(fairness_price=0.08))   # 3g for 2/3 of the jobs
    for g in range(8):
        st.observe(0.0, GpuAdded(f"g{g}", "A100-40GB"))
    for i in range(200):          # 25 active jobs per GPU: saturated
        st.observe(float(i), JobSubmitted(JobSpec(f"h{i}", "x", 5.0, owner="h")))
    for i in range(8):
        st.observe(300.0 + i, JobSubmitted(JobSpec(f"l{i}", "x", 5.0, owner="l")))
    sc = Scratch(st)
    sc.entitlements()
    ten = st.tenancy
    assert ten is not None and ten.budget is not None and ten.budget.share > 0
    geom = st.gpus["g0"].geom
    caps = {j: ten.budget.cap_of(j) for j in (f"l{i}" for i in range(8))}
    assert {round(c * 7) for c in caps.values()} == {2, 3}
    smallest = {j: min(geom.model.profile(p).compute_slices for p in
                       sc.fair.fair_slices(geom, "l", j) or ()) for j in caps}
    assert all(smallest[j] == round(c * 7) for j, c in caps.items())


def test_entitled_speeds__as_many_protected_jobs_keep_their_fair_slice_as_a_layout_holds():
    """One A100 for three jobs of a protected owner (each owed 2g: entitlement 1 GPU for 3
    jobs of demand 2/7) and two of an owner far above its entitlement: 3 x 2g + 2 x 1g is 8
    compute slices, more than the GPU's 7, so not every light job can keep 2g. Two of them
    still do (2g 2g 1g 1g 1g is a valid layout); dropping every job's fair slice, as before,
    left all five on any slice."""
    from miso.sched.policies.base import Scratch

    st = ClusterState(TenancyConfig(demand_per_job=2 / 7))
    for g in range(4):
        st.observe(0.0, GpuAdded(f"g{g}", "A100-40GB"))
    for i in range(3):
        st.observe(float(i), JobSubmitted(JobSpec(f"l{i}", "x", 4.0, owner="l")))
    for i in range(2):
        st.observe(10.0 + i, JobSubmitted(JobSpec(f"h{i}", "x", 4.0, owner="h")))
    ten = st.tenancy
    assert ten is not None
    ten.held["h"] = 5.0             # far above its entitlement: not protected
    sc = Scratch(st)
    geom = st.gpus["g0"].geom
    every = {p.name: p.compute_slices / 7 for p in geom.profiles}
    speeds = {j: dict(every) for j in ("l0", "l1", "l2", "h0", "h1")}
    got = sc.fair.speeds("g0", speeds)
    owed = {j for j in ("l0", "l1", "l2") if "1g.5gb" not in got[j]}
    assert len(owed) == 2
    assert all(min(geom.model.profile(p).compute_slices for p in got[j]) == 2 for j in owed)
    assert got["h0"] == every and got["h1"] == every
    # a layout still gives every job one of its offered profiles
    assert sc.fair._holds(geom, got)
    # with room for all of them (one light job fewer) every light job keeps its fair slice
    del speeds["l2"]
    assert all("1g.5gb" not in sc.fair.speeds("g0", speeds)[j] for j in ("l0", "l1"))
