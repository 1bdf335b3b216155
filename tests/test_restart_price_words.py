"""One name, one value (issue 27): a plan's explanation states the restart price the plan
was chosen with (the job's learned cost, else the prior), not the configured prior."""

from __future__ import annotations

from miso.sched.decisions import ApplyLayout
from miso.sim.run import run_policy
from miso.sim.traces import poisson_jobs
from miso.sim.world import WorldConfig


def test_plan_notes_state_the_price_each_restart_was_priced_at() -> None:
    jobs = poisson_jobs(80, seed=1, mean_interarrival_s=30.0)
    # The world's restarts take about 60 s; the policy's prior says 300 s: once learned, the
    # prices are the measured ones.
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=3, restart_s=60.0), 1, record=True,
                   restart_s=300.0)
    priced = [d.why for _, d in r.log
              if isinstance(d, ApplyLayout) and d.why and d.why.get("restart_costs")]
    assert priced
    for why in priced:
        for j, cost in why["restart_costs"].items():
            assert f"{j} ({cost:.3g} s)" in why["note"]
        assert "300 s each" not in why["note"]
    assert any(c < 300.0 for why in priced for c in why["restart_costs"].values())
