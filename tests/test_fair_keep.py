"""Issue 31: a protected owner's job that has run ``KEEP_AFTER_S`` keeps the slice it runs on
as its fair slice when the stated price's cap falls with a flood
(``miso.sched.policies.entitled.Entitled.kept``)."""

from __future__ import annotations

import pytest
from helpers import profiles_given

from miso.sched.policies import entitled
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


def _l_slices(flood_at: float) -> tuple[list[str], float]:
    """Two A100s; L's one long job runs alone from t=0, H floods 40 one-GPU jobs from
    ``flood_at``: the profiles L's job was given in turn, and its JCT."""
    jobs = [TraceJob("l", 0.0, 200_000.0, "transformer_train128", "L")]
    jobs += [TraceJob(f"h{i:02d}", flood_at + 10 * i, 60_000.0, "mobilenet_train64", "H")
             for i in range(40)]
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=2), 1, record=True,
                   tenancy=TenancyConfig(fairness_price=0.05))
    got = profiles_given(r.log, "l")
    return got, float(r.jct[r.job_ids.index("l")])


def test_kept__a_long_running_job_keeps_its_whole_gpu_when_the_flood_lowers_the_cap():
    got, jct = _l_slices(25_000.0)
    assert got == ["7g.40gb"]
    assert jct < 201_000.0


def test_kept__not_before_it_has_run_that_long(monkeypatch: pytest.MonkeyPatch):
    # the same flood with the rule off, and a flood after 5,000 s with it on: L's job is
    # moved to smaller slices beside H's jobs (the cap fell) and ends far later. (Growth
    # off in both: L's weighted part, one GPU for its one job, would keep its whole GPU,
    # ``Entitled.grown``.)
    monkeypatch.setattr(entitled, "whole_owed", lambda *a: 0.0)
    monkeypatch.setattr(entitled, "KEEP_AFTER_S", float("inf"))
    got, jct = _l_slices(25_000.0)
    assert "7g.40gb" in got and len(got) > 1 and jct > 210_000.0
    monkeypatch.undo()
    monkeypatch.setattr(entitled, "whole_owed", lambda *a: 0.0)
    got, jct = _l_slices(5_000.0)
    assert got[:2] == ["7g.40gb", "4g.20gb"] and jct > 210_000.0
