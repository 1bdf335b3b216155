"""Issue 31: a waiting owner that holds nothing gets its first room by reclaim when its job
needs more than packing's share (``miso.sched.policies.fairhold.first_room``)."""

from __future__ import annotations

from miso.sched import RequeueJob
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


def _flood_then_large_job() -> list[TraceJob]:
    """One A100 filled by H's seven long 1g jobs and a stream of more; L, holding nothing,
    submits a job that needs a 3g slice at t=1,000 s."""
    jobs = [TraceJob(f"h{i}", float(i), 30_000.0 + 400 * i, "mobilenet_train64", "H")
            for i in range(7)]
    jobs.append(TraceJob("l", 1_000.0, 2_000.0, "transformer_train128", "L"))
    jobs += [TraceJob(f"m{i:02d}", 1_200.0 + 300 * i, 30_000.0, "mobilenet_train64", "H")
             for i in range(20)]
    return jobs


def test_first_room__an_owner_holding_nothing_is_given_room_for_a_job_above_packing():
    # Fair slices of 1g (demand_per_job 1/7) buy no reclaim by themselves (packing gives 1g);
    # L's job needs 3g, which packing never frees while H keeps submitting: without the
    # first room it waited until H's jobs ended (38,122 s).
    r = run_policy("miso+", _flood_then_large_job(), WorldConfig(n_gpus=1), 1, record=True,
                   tenancy=TenancyConfig(min_run_s=600.0, demand_per_job=1 / 7))
    start = dict(zip(r.job_ids, (float(x) for x in r.first_start), strict=True))
    assert start["l"] < 1_100.0
    why = [d.why for _, d in r.log if isinstance(d, RequeueJob) and d.why
           and d.why.get("trigger") == "reclaim"]
    assert why and all(w["for_job"] == "l" and w["packed_share"] == 0.0 for w in why)
    assert r.reclaim_events == 1 and r.reclaims_useless == 0


def test_first_room__not_for_a_job_packing_can_give_its_slice():
    # The same flood, L's job fitting a 1g slice: packing gives it one as H's jobs end, so
    # nothing is reclaimed for it (the fair-slice rule: reclaim only when it buys something).
    jobs = [j if j.id != "l" else TraceJob("l", 1_000.0, 2_000.0, "mobilenet_train64", "L")
            for j in _flood_then_large_job()]
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=1), 1,
                   tenancy=TenancyConfig(min_run_s=600.0, demand_per_job=1 / 7))
    assert r.reclaims == 0
