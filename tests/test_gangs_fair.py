"""Gangs under fair share (issue 31): queued gangs in fair share's order, and the first of
them, owed its room, reclaims it from an over-entitled owner's whole-GPU runs."""

from __future__ import annotations

import pytest

from miso.sched import make_policy
from miso.sched.decisions import PlaceJob, RequeueCause, RequeueJob, StopGang
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.engine import Simulator
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig

WL = "resnet_train64"


def _run(jobs: list[TraceJob], gpus: int, ten: TenancyConfig | None):  # noqa: ANN202
    cfg = WorldConfig(n_gpus=gpus, reconfig_s=0.0, restart_s=0.0)
    r = Simulator(make_policy("nopart"), jobs, cfg, record=True, tenancy=ten).run()
    start = dict(zip(r.job_ids, r.first_start, strict=True))
    fin = dict(zip(r.job_ids, r.finish, strict=True))
    return r, start, fin


def _light_owner_behind_heavy() -> list[TraceJob]:
    """Owner a fills 8 GPUs with two 4-GPU gangs and queues a third; b's gang comes later."""
    return [TraceJob("a1", 0.0, 10_000.0, WL, owner="a", num_gpus=4),
            TraceJob("a2", 0.0, 20_000.0, WL, owner="a", num_gpus=4),
            TraceJob("a3", 1.0, 5_000.0, WL, owner="a", num_gpus=4),
            TraceJob("b1", 1_000.0, 3_000.0, WL, owner="b", num_gpus=4)]


def test_gang_queue__fifo_without_fair_share_fair_order_with_it():
    jobs = _light_owner_behind_heavy()
    _, start, _ = _run(jobs, 8, TenancyConfig(fair_share=False))
    assert start["a3"] == pytest.approx(10_000.0)   # FIFO: a's older gang first
    assert start["b1"] == pytest.approx(15_000.0)
    _, start, fin = _run(jobs, 8, TenancyConfig(fair_share=True, reclaim=False))
    assert start["b1"] == pytest.approx(10_000.0)   # b has used nothing: first in order
    assert start["a3"] == pytest.approx(fin["b1"])


def test_gang_reclaim__owed_gang_starts_on_an_over_entitled_owners_stopped_run():
    # 8 GPUs, a and b with demand 12 and 4: each entitled to 4; a holds 8.
    r, start, fin = _run(_light_owner_behind_heavy(), 8, TenancyConfig(fair_share=True))
    assert start["b1"] == pytest.approx(1_000.0)
    stops = [d for _, d in r.log if isinstance(d, StopGang)]
    assert len(stops) == 1 and stops[0].job in {"a1", "a2"}
    assert "reclaimed for b1" in stops[0].reason
    restarts = dict(zip(r.job_ids, r.restarts, strict=True))
    assert restarts[stops[0].job] == 1 and restarts["b1"] == 0
    # a keeps its entitled half all along: the other gang runs on untouched
    other = ({"a1", "a2"} - {stops[0].job}).pop()
    assert restarts[other] == 0 and start[other] == pytest.approx(0.0)


def test_gang_reclaim__never_stops_a_run_its_owner_would_be_owed_back():
    # a, c and b each entitled to 8/3 GPUs; a and c hold one 4-GPU gang each, no more than
    # their entitlement rounded up to that gang: stopped, it would be owed its room back.
    # b's 8-GPU gang waits for them to end.
    jobs = [TraceJob("a1", 0.0, 10_000.0, WL, owner="a", num_gpus=4),
            TraceJob("c1", 0.0, 10_000.0, WL, owner="c", num_gpus=4),
            TraceJob("b1", 1_000.0, 3_000.0, WL, owner="b", num_gpus=8)]
    r, start, _ = _run(jobs, 8, TenancyConfig(fair_share=True))
    assert not [d for _, d in r.log if isinstance(d, StopGang)]
    assert start["b1"] == pytest.approx(10_000.0)


def test_gang_reclaim__owed_gang_takes_over_entitled_owners_one_gpu_jobs_off_whole_gpus():
    # 4 GPUs filled by a's one-GPU jobs (and more of them queued); b's 2-GPU gang is owed
    # half the cluster: two GPUs are emptied for it (a's jobs requeued), not drained for
    # 10,000 s, and go back to the policy when the gang ends.
    jobs = [TraceJob(f"a{i}", 0.0, 10_000.0, WL, owner="a") for i in range(6)]
    jobs.append(TraceJob("b1", 1_000.0, 2_000.0, WL, owner="b", num_gpus=2))
    r, start, fin = _run(jobs, 4, TenancyConfig(fair_share=True))
    assert start["b1"] == pytest.approx(1_000.0)
    reqs = [d for _, d in r.log if isinstance(d, RequeueJob)]
    assert len(reqs) == 2 and all(d.cause is RequeueCause.RECLAIMED for d in reqs)
    assert all(d.why["for_gang"] == "b1" for d in reqs)
    # after b1 ends its GPUs go back to the policy: the requeued jobs run again at once
    back = {d.job: t for t, d in r.log if isinstance(d, PlaceJob) and t > 1_000.0}
    assert {d.job for d in reqs} <= set(back)
    assert all(back[d.job] == pytest.approx(fin["b1"]) for d in reqs)
    # fair share off: the gang waits for a's jobs to end
    _, start, _ = _run(jobs, 4, TenancyConfig(fair_share=False))
    assert start["b1"] == pytest.approx(10_000.0)


def test_backfill__in_fair_share_order_beyond_the_fifo_window():
    # 2 GPUs, both reserved for c's gang (a1 drains one until 10,000 s); a's 70 short jobs
    # were queued before b's one job. When gpu1 idles at 2,000 s it is backfilled: with fair
    # share by b's job (b has used nothing; in FIFO it is past the window of 64), without it
    # by a's oldest queued job.
    jobs = [TraceJob("a1", 0.0, 10_000.0, WL, owner="a"),
            TraceJob("a2", 0.0, 2_000.0, WL, owner="a"),
            TraceJob("g", 1.0, 1_000.0, WL, owner="c", num_gpus=2)]
    jobs += [TraceJob(f"q{i}", 2.0 + i, 500.0, WL, owner="a") for i in range(70)]
    jobs.append(TraceJob("b1", 100.0, 500.0, WL, owner="b"))
    _, start, _ = _run(jobs, 2, TenancyConfig(fair_share=True, reclaim=False))
    assert start["b1"] == pytest.approx(2_000.0)
    _, start, _ = _run(jobs, 2, TenancyConfig(fair_share=False))
    assert start["q0"] == pytest.approx(2_000.0) and start["b1"] > 2_000.0


def _gang_behind_a_far_run() -> list[TraceJob]:
    """5 GPUs: c's 2-GPU gang runs 50,000 s; a runs two long jobs and a short one, queues a
    long one (backfilled on the short one's GPU once it ends); b's 2-GPU gang comes at
    1,000 s; a's last job at 1,500 s is the next decision."""
    return [TraceJob("c1", 0.0, 50_000.0, WL, owner="c", num_gpus=2),
            TraceJob("a1", 800.0, 100_000.0, WL, owner="a"),
            TraceJob("a2", 800.0, 100_000.0, WL, owner="a"),
            TraceJob("a3", 800.0, 400.0, WL, owner="a"),
            TraceJob("a4", 800.0, 40_000.0, WL, owner="a"),
            TraceJob("b1", 1_000.0, 2_000.0, WL, owner="b", num_gpus=2),
            TraceJob("a5", 1_500.0, 1_000.0, WL, owner="a")]


def test_gang_reservation__drains_a_gpu_it_may_empty_not_a_run_ending_days_later(
        monkeypatch: pytest.MonkeyPatch):
    # With a stated price. Entitled to 5/3 GPUs each; c's gang is not over by a run (never
    # stopped); a holds 3 GPUs (a1, a2, and a4 backfilled on a3's GPU), so one of its GPUs may
    # be emptied, not two. b1 reserves a3's GPU (free at 1,200 s) and a1's, held from 1,000 s
    # (a1 may be requeued once it has run min_run_s, 600 s); at 1,500 s a1 is requeued, the
    # backfill stopped, and b1 starts.
    ten = TenancyConfig(fair_share=True, fairness_price=0.05)
    r, start, _ = _run(_gang_behind_a_far_run(), 5, ten)
    assert start["b1"] == pytest.approx(1_500.0)
    reqs = [d for _, d in r.log if isinstance(d, RequeueJob)]
    assert [d.job for d in reqs] == ["a1"] and reqs[0].why["for_gang"] == "b1"
    stops = [d for _, d in r.log if isinstance(d, StopGang)]
    assert [d.job for d in stops] == ["a4"]
    # ranked by expected ends only, b1 reserves one of c1's GPUs (50,000 s) and a3's: the
    # backfill keeps a3's GPU from the pool and a may lose only one GPU, so b1 waits
    # (and so without a stated price: the reservation's draining needs one)
    _, start, _ = _run(_gang_behind_a_far_run(), 5, TenancyConfig(fair_share=True))
    assert start["b1"] > 40_000.0
    from miso.sched import gangs
    monkeypatch.setattr(gangs, "takeable", lambda ps, head: (lambda g, end: (end, 0)))
    _, start, _ = _run(_gang_behind_a_far_run(), 5, ten)
    assert start["b1"] > 40_000.0



def test_gang_reservation__drains_the_gpus_whose_residents_have_least_work_left():
    # With a stated price. 4 GPUs, one job of a on each from 800 s: a1, a2 with 100,000 s
    # of work, a3, a4 with 5,000 s. b's 2-GPU gang (owed: 2 GPUs each) comes at 1,000 s;
    # every GPU may be emptied at 1,600 s (one resident each, min_run_s 600 s), so the
    # reservation holds the two whose residents have the least work left: at 1,500 s (a5,
    # the next decision) a3 and a4 are requeued and b1 starts; a1 and a2 run on untouched.
    # By the fewest residents (the tie broken by GPU order), a1 and a2 were requeued:
    # in the Philly flood those were its long jobs, back at the front of its FIFO.
    jobs = [TraceJob("a1", 800.0, 100_000.0, WL, owner="a"),
            TraceJob("a2", 800.0, 100_000.0, WL, owner="a"),
            TraceJob("a3", 800.0, 5_000.0, WL, owner="a"),
            TraceJob("a4", 800.0, 5_000.0, WL, owner="a"),
            TraceJob("b1", 1_000.0, 2_000.0, WL, owner="b", num_gpus=2),
            TraceJob("a5", 1_500.0, 1_000.0, WL, owner="a")]
    r, start, fin = _run(jobs, 4, TenancyConfig(fair_share=True, fairness_price=0.05))
    assert start["b1"] == pytest.approx(1_500.0)
    reqs = [d for _, d in r.log if isinstance(d, RequeueJob)]
    assert sorted(d.job for d in reqs) == ["a3", "a4"]
    assert all(d.why["for_gang"] == "b1" for d in reqs)
    restarts = dict(zip(r.job_ids, r.restarts, strict=True))
    assert restarts["a1"] == restarts["a2"] == 0
    assert fin["a1"] == pytest.approx(100_800.0) and fin["a2"] == pytest.approx(100_800.0)
