"""Issue 31: a protected owner's only active job is owed what it would get alone on the
owner's weighted part of the cluster, up to the largest slice below a whole GPU
(``miso.sched.fairunused``, ``Entitled.first``), when the stated price's cap has fallen."""

from __future__ import annotations

import pytest

from miso.sched import ApplyLayout
from miso.sched.fairunused import first_slice, weighted_part
from miso.sched.policies import entitled
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig

A100 = [1 / 7, 2 / 7, 3 / 7, 4 / 7, 1.0]


def test_weighted_part__by_weight_among_owners_with_active_jobs():
    active = {"a": 3, "b": 1, "c": 0}
    weight = {"a": 2.0, "b": 1.0, "c": 5.0}
    assert weighted_part("b", active, weight, 12.0) == pytest.approx(4.0)   # 12 x 1/3
    assert weighted_part("a", active, weight, 12.0) == pytest.approx(8.0)
    assert weighted_part("c", active, weight, 12.0) == 0.0                  # no active jobs


def test_first_slice__alone_part_per_job_up_to_the_largest_slice_below_a_whole_gpu():
    assert first_slice(1.2, 1, A100) == pytest.approx(4 / 7)    # a whole GPU alone: 4g
    assert first_slice(1.2, 3, A100) == pytest.approx(0.4)      # 0.4 of a GPU each
    assert first_slice(0.0, 1, A100) == 0.0
    assert first_slice(2.0, 0, A100) == 0.0


def _l_jobs(monkeypatch: pytest.MonkeyPatch | None) -> list[tuple[list[str], float]]:
    """Two A100s flooded by H's 40 long jobs; L submits one 1,000 s job at a time: each L
    job's profiles in turn and its JCT (``monkeypatch``: the rule off)."""
    if monkeypatch is not None:
        monkeypatch.setattr(entitled, "first_slice", lambda *a: 0.0)
    jobs = [TraceJob(f"h{i:02d}", 10.0 * i, 60_000.0, "mobilenet_train64", "H")
            for i in range(40)]
    jobs += [TraceJob(f"l{i}", 5_000.0 + 4_000 * i, 1_000.0, "transformer_train128", "L")
             for i in range(3)]
    r = run_policy("miso+", jobs, WorldConfig(n_gpus=2), 1, record=True,
                   tenancy=TenancyConfig(fairness_price=0.05))
    out = []
    for j in ("l0", "l1", "l2"):
        got: list[str] = []
        for _, d in r.log:
            if isinstance(d, ApplyLayout) and j in d.assignment:
                p = d.assignment[j].profile
                if not got or got[-1] != p:
                    got.append(p)
        out.append((got, float(r.jct[r.job_ids.index(j)])))
    return out


def test_first__a_lone_owners_job_gets_4g_in_a_flood(monkeypatch: pytest.MonkeyPatch):
    on = _l_jobs(None)
    assert all(got == ["4g.20gb"] for got, _ in on)
    off = _l_jobs(monkeypatch)    # the price's cap: the smallest slice that fits (3g)
    assert all(got == ["3g.20gb"] for got, _ in off)
    assert max(j for _, j in on) < min(j for _, j in off)
