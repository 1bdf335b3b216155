"""Issue 33: a repartition miso+ gives up for its restarts leaves a decision record with the
gain and the restart price that outweighed it (:mod:`miso.sched.policies.declined`), in the
simulator's decision log, the explanation records, and ``miso status`` for a queued job."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from miso.controller.loopview import declined_json
from miso.controller.statustext import why
from miso.mig import Placement
from miso.observe import DecisionLog, Observer, policy_estimates
from miso.observe.decisionwords import describe
from miso.sched import (
    ApplyLayout,
    ClusterState,
    Decision,
    GpuAdded,
    JobSpec,
    JobSubmitted,
    LayoutApplied,
    PlaceJob,
)
from miso.sched.decisions import RepartitionDeclined
from miso.sched.policies.base import Scratch
from miso.sched.policies.declined import declined_plan
from miso.sim.run import run_policy
from miso.sim.traces import poisson_jobs
from miso.sim.world import WorldConfig

FOUR = Placement(0, "4g.20gb")
THREE = Placement(4, "3g.20gb")
FULL = Placement(0, "7g.40gb")


def _lone_job_on_a_slice() -> ClusterState:
    """One A100 with job a running alone on its 4g slice (the 3g beside it idle)."""
    st = ClusterState()
    st.observe(0.0, GpuAdded("g0", "A100-40GB"))
    st.observe(0.0, JobSubmitted(JobSpec("a", "a", 10.0)))
    st.apply(0.0, PlaceJob("a", "g0"))
    pid = st.new_plan_id()
    st.apply(0.0, ApplyLayout("g0", pid, (FOUR, THREE), {"a": FOUR}))
    st.observe(1.0, LayoutApplied("g0", pid))
    return st


def _policy() -> SimpleNamespace:
    return SimpleNamespace(objective="throughput", declines={},
                           restarts=SimpleNamespace(cost=lambda j: 120.0))


def test_a_repartition_priced_out_by_its_restart_writes_gain_and_price() -> None:
    st = _lone_job_on_a_slice()
    sc = Scratch(st)
    speeds = {"a": {"7g.40gb": 1.0, "4g.20gb": 0.6, "3g.20gb": 0.5}}
    # growing a onto the full GPU gains 0.4 of total speed; its restart is priced at 0.5
    declined_plan(_policy(), sc, "g0", speeds, {"a": FOUR}, set(), (240.0, {"a": 0.5}), None)
    (d,) = sc.out
    assert isinstance(d, RepartitionDeclined)
    assert (d.gpu, d.restarts, d.job) == ("g0", ("a",), "")
    assert d.gain == pytest.approx(0.4)
    assert d.price == pytest.approx(0.5)
    assert d.why is not None and d.why["unit"] == "speed" and d.why["horizon_s"] == 240.0
    assert d.why["layout"] == [str(FULL)] and d.why["restart_costs"] == {"a": 120.0}
    assert "gain 0.400" in d.why["note"] and "priced at 0.500" in d.why["note"]
    assert "the restarts outweigh the gain" in d.why["note"]


def test_a_decline_repeated_unchanged_is_recorded_once_and_ties_are_not_declines() -> None:
    st = _lone_job_on_a_slice()
    pol = _policy()
    speeds = {"a": {"7g.40gb": 1.0, "4g.20gb": 0.6, "3g.20gb": 0.5}}
    args = ("g0", speeds, {"a": FOUR}, set(), (240.0, {"a": 0.5}), None)
    first, again = Scratch(st), Scratch(st)
    declined_plan(pol, first, *args)
    declined_plan(pol, again, *args)
    assert len(first.out) == 1 and again.out == []
    tie = Scratch(st)
    flat = {"a": {"7g.40gb": 0.6, "4g.20gb": 0.6, "3g.20gb": 0.5}}
    declined_plan(_policy(), tie, "g0", flat, {"a": FOUR}, set(), (240.0, {"a": 0.5}), None)
    assert tie.out == []


def test_the_simulators_decision_log_shows_a_declined_repartition_with_its_numbers() -> None:
    logs: list[DecisionLog] = []

    def observer(pol: object) -> Observer:
        logs.append(DecisionLog(None))
        return Observer(None, logs[-1], estimates=policy_estimates(pol))

    # a few small runs (declines are rare once headroom is kept only where it pays): the
    # first with a repartition whose restarts cost more than its gain is checked
    for seed, gap, gpus in ((1, 60.0, 4), (3, 60.0, 8), (5, 120.0, 4), (4, 60.0, 8)):
        logs.clear()
        r = run_policy("miso+", poisson_jobs(60, seed=seed, mean_interarrival_s=gap),
                       WorldConfig(n_gpus=gpus, restart_s=120.0), 1, record=True,
                       observer=observer)
        got = [d for _, d in r.log if isinstance(d, RepartitionDeclined) and not d.job]
        if any(d.price >= d.gain for d in got):
            break
    else:
        raise AssertionError("no run has a repartition whose restarts cost more than its gain")
    for d in got:
        w = d.why or {}
        assert d.gain > 0 and d.restarts
        assert d.gain == pytest.approx(w["throughput"] - w["current_objective"])
        assert d.price == pytest.approx(sum(w["restart_prices"].values()))
        assert set(w["restart_prices"]) == set(d.restarts)
    assert r.decisions == sum(1 for _, x in r.log if isinstance(x, Decision)
                              and not isinstance(x, RepartitionDeclined)), \
        "records are not counted as decisions"
    recs = [x for x in logs[0].recent(100_000) if x["kind"] == "RepartitionDeclined"
            and not x.get("job")]
    assert len(recs) == len(got)
    text = describe(recs[0])
    assert "layout kept: repartition declined" in text
    assert "vs restart price" in text and "would restart" in text


def test_a_queued_job_that_waits_for_a_whole_gpu_says_why_in_status() -> None:
    d = RepartitionDeclined("gpu1", ("7", "9"), 95.0, 240.0, "12")
    snap = {"gpus": [{"id": "gpu1", "phase": "running", "jobs": ["7", "9"]}],
            "queue": ["12"], "declined": {"12": declined_json(d)}}
    line = why({"id": "12", "state": "queued", "memory_gib": 5.0}, snap)
    assert line == ("waiting for a whole GPU rather than share gpu1: sharing it would end "
                    "the jobs 95 s sooner in total, but restarting its 2 running jobs costs "
                    "240 s")
    assert "7" not in line  # no job ids of others in a status line
    worse = {**snap, "declined": {"12": declined_json(
        RepartitionDeclined("gpu1", (), -300.0, 0.0, "12"))}}
    assert "would not end the jobs sooner" in why(
        {"id": "12", "state": "queued", "memory_gib": 5.0}, worse)


def test_live_controller_logs_the_same_records_and_status_says_why_a_job_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's stream replayed into a live Controller (virtual clock, no agents, as
    test_parity.py) up to miso+'s first declined share: the live loop records the same
    RepartitionDeclined, and ``status`` gives the waiting job its reason instead of "the
    policy has not placed it"."""
    import test_parity as parity

    from miso.controller import Controller

    jobs = parity._trace(40, seed=2)
    cfg = WorldConfig(n_gpus=3, restart_s=120.0)
    log = parity._simulate("miso+", jobs, cfg, [])
    t0, first = next((t, d) for t, d in log if isinstance(d, RepartitionDeclined))
    made: list[Controller] = []
    init = Controller.__init__

    def keep(self: Controller, *a: object, **k: object) -> None:
        init(self, *a, **k)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(Controller, "__init__", keep)
    live = parity._replay("miso+", jobs, cfg, [(t, x) for t, x in log if t <= t0])
    got = [d for _, d in live if isinstance(d, RepartitionDeclined)]
    assert [repr(d) for d in got] == [repr(first)]
    assert got[0].why == first.why
    (con,) = made
    wait = next(j for j in con.status()["jobs"] if j["id"] == first.job)
    assert wait["state"] == "queued"
    assert wait["why"].startswith(f"waiting for a whole GPU rather than share {first.gpu}: ")
