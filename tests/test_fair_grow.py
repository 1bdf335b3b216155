"""Issue 31, Philly by vc: with a stated price, a protected owner's job that has run long
(``Entitled.kept``) grows in place to a whole GPU when its owner's weighted part of the
cluster gives each of its active jobs one (``fairunused.whole_owed``, ``reclaim._grow``):
the other owners' jobs on its GPU are requeued."""

from __future__ import annotations

import pytest
from helpers import profiles_given

from miso.sched.decisions import RequeueJob
from miso.sched.fairunused import whole_owed
from miso.sched.policies import entitled
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


def test_whole_owed__a_whole_gpu_only_when_the_part_gives_every_job_one():
    assert whole_owed(1.0, 1) == 1.0
    assert whole_owed(2.5, 2) == 1.0
    assert whole_owed(1.5, 2) == 0.0
    assert whole_owed(3.0, 0) == 0.0


def _long_l_job(monkeypatch: pytest.MonkeyPatch | None):  # noqa: ANN202
    """Six A100s flooded by H's long jobs; L's one 100,000 s job comes at 5,000 s: its
    profiles in turn, its JCT and the requeues made for it (``monkeypatch``: growth off)."""
    if monkeypatch is not None:
        monkeypatch.setattr(entitled, "whole_owed", lambda *a: 0.0)
    jobs = [TraceJob(f"h{i:02d}", 10.0 * i, 200_000.0, "mobilenet_train64", "H")
            for i in range(60)]
    jobs += [TraceJob(f"s{i:02d}", 1_000.0 * i, 100.0, "mobilenet_train64", "H")
             for i in range(1, 60)]     # a decision now and then
    jobs.append(TraceJob("l0", 5_000.0, 100_000.0, "transformer_train128", "L"))
    # keep_margin 0.25: with two owners H can hold at most 0.43 GPU over its entitlement
    # (L's one job on 4g); with the default margin (1 GPU) H would stay protected
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=6), 1, record=True,
                   tenancy=TenancyConfig(fairness_price=0.05, keep_margin=0.25))
    got = profiles_given(r.log, "l0")
    grown = [d for _, d in r.log if isinstance(d, RequeueJob) and d.why
             and d.why.get("for_job") == "l0" and d.why.get("fair_slice") == 1.0]
    return got, float(r.jct[r.job_ids.index("l0")]), grown


def test_grow__a_long_job_of_a_lone_owner_grows_to_a_whole_gpu(
        monkeypatch: pytest.MonkeyPatch):
    # L's weighted part is three GPUs (two owners, equal weights, six GPUs), one job:
    # it starts on 4g (the first slice) and, once it has run 20,000 s, takes its GPU whole.
    got, jct, grown = _long_l_job(None)
    assert got == ["4g.20gb", "7g.40gb"]
    assert grown and all(d.why["packed_share"] < 1.0 for d in grown)
    off_got, off_jct, off_grown = _long_l_job(monkeypatch)
    assert off_got == ["4g.20gb"] and not off_grown
    assert jct < off_jct
