"""What a user and an operator read (issue 33): names, not ids; explanations that agree with
the plan; every client command in one style. Fast tests over pure views and fakes."""

from __future__ import annotations

from rich.console import Console

from miso.cli.client import render_status
from miso.observe.decisions import name_owners
from miso.observe.observer import Observer, attach

UID = "u:bcdc0357106ff357"


def _text(tables: list) -> str:
    con = Console(width=200, record=True)
    for t in tables:
        con.print(t)
    return con.export_text()


def test_the_admins_status_owner_column_says_names_not_ids() -> None:
    st = {"user": "root", "admin": True, "policy": "miso", "gpus": [],
          "jobs": [{"id": "j0001", "name": "a", "state": "queued", "owner": UID,
                    "owner_name": "alice", "restarts": 0}]}
    out = _text(render_status(st))
    assert "alice" in out and UID not in out


def test_fair_share_lines_of_the_decision_log_name_owners() -> None:
    rec = {"kind": "PlaceJob", "note": f"job j0002 goes to g; fair share: starts {UID}'s job "
           f"before 3 jobs of u:0000000000000001 queued earlier",
           "order": f"fair share: starts {UID}'s job"}
    out = name_owners(rec, {UID: "alice"})
    assert "alice's job" in out["note"] and "alice's job" in out["order"]
    assert UID not in out["note"] and "u:0000000000000001" in out["note"]  # unknown: kept


def test_attach_gives_the_observer_the_controllers_owner_names() -> None:
    class Ctl:
        policy = None
        owner_names = {UID: "alice"}
        observer: Observer | None = None

        def status(self) -> dict:
            return {}

    ctl = Ctl()
    obs = attach(ctl, None, metrics=False)
    assert obs.owner_names is ctl.owner_names


def test_after_profiling_the_text_names_the_measured_speed_not_a_prior() -> None:
    from miso.observe.decisions import trigger_of
    from miso.observe.decisionwords import describe
    from miso.sched import ProfilingFinished

    trig, cause = trigger_of(ProfilingFinished(gpu="n/0", plan_id=7, levels=(50, 100),
                                               speeds={"j0001": (3.0, 4.5), "j0002": (1, 2)}))
    assert trig == "profiled" and cause["measured"] == {"j0001": 4.5, "j0002": 2.0}
    rec = {"time": 10.0, "kind": "ApplyLayout", "gpu": "n/0", "plan_id": 8,
           "trigger": trig, "cause": cause, "layout": ["4g.20gb@0", "3g.20gb@4"],
           "assignment": {"j0001": "4g.20gb@0", "j0002": "3g.20gb@4"},
           "speeds": {"j0001": {"4g.20gb": 1.0}, "j0002": {"3g.20gb": 0.6}},
           "prior": ["j0001"], "current_layout": [], "current_assignment": {},
           "objective": 1.6, "current_objective": None,
           "note": "n/0: best layout for its mix, total speed 1.60 (nothing ran before)"}
    text = describe(rec)
    assert "measured 4.5 it/s with the mix at 100 %" in text
    assert "prior estimate" not in text
    assert "current: none" not in text and "MPS profiling run" in text


def test_no_nothing_ran_before_on_a_gpu_that_ran_jobs() -> None:
    from miso.mig import Placement
    from miso.observe.decisions import Context, explain
    from miso.sched import ApplyLayout, ClusterState, JobFinished

    class Empty(ClusterState):
        def __init__(self) -> None:
            self.gpus, self.jobs = {}, {}

    d = ApplyLayout(gpu="n/0", plan_id=3, layout=(Placement(0, "7g.40gb"),),
                    assignment={"j0002": Placement(0, "7g.40gb")},
                    why={"note": "n/0: best layout for its mix, total speed 1.00 "
                                 "(nothing ran before)"})
    rec = explain(5.0, d, Empty(), Context(event=JobFinished(job="j0001"),
                                           restarted=["j0002"]))
    assert "nothing ran before" not in rec["note"]


def test_a_slice_after_profiling_shows_its_mig_slice_not_mps_100() -> None:
    st = {"user": "ann", "admin": False, "policy": "miso",
          "gpus": [{"id": "n/0", "model": "A100-40GB", "phase": "running",
                    "layout": ["4g.20gb@0"], "assignment": {"j0001": "4g.20gb@0"},
                    "mps_shares": {}, "jobs": ["j0001"]}],
          "jobs": [{"id": "j0001", "name": "a", "state": "running", "gpu": "n/0",
                    "placement": "4g.20gb@0", "mps_pct": 100, "restarts": 0}]}
    out = _text(render_status(st))
    assert "MPS 100%" not in out and "4g.20gb@0" in out
    st["gpus"][0]["phase"] = "profiling"
    assert "MPS 100%" in _text(render_status(st))


def test_a_job_blocked_by_a_job_that_cannot_checkpoint_names_it() -> None:
    from miso.controller.statustext import why

    snap = {"gpus": [{"id": "n/0", "phase": "running", "jobs": ["j0001", "j0002"]}]}
    j = {"id": "j0002", "state": "queued"}
    pinned = {"j0001"}.__contains__
    assert "job j0001 (train) cannot checkpoint" in why(
        j, snap, pinned, job_name=lambda x: f"job {x} (train)")
    assert "another user's job cannot checkpoint" in why(
        j, snap, pinned, job_name=lambda x: "another user's job")


def test_no_internal_words_in_user_text() -> None:
    from miso.controller.statustext import why
    from miso.observe.decisionwords import describe

    for tag in ("quiet", "reclaim", "reprofile:n/0"):
        text = describe({"time": 1.0, "kind": "WakeUp", "tag": tag, "trigger": "timer",
                         "note": "x"})
        assert f"timer {tag}" not in text and "scheduled check" in text
    snap = {"gpus": [{"id": "n/0", "phase": "running", "jobs": ["j0001"]}]}
    text = why({"id": "j0009", "state": "queued", "memory_gib": 4.0}, snap)
    assert "1 jobs" not in text and "1 job" in text


def test_a_lost_gpu_and_its_return_are_in_the_decision_log() -> None:
    from miso.observe import DecisionLog
    from miso.observe.decisions import mentions
    from miso.observe.decisionwords import describe
    from miso.sched import ClusterState, GpuAdded, GpuRemoved, JobSpec, JobSubmitted, PlaceJob

    st = ClusterState()
    st.observe(0.0, GpuAdded("n0/0", "A100-40GB"))
    st.observe(0.0, JobSubmitted(JobSpec("j0001", "w", 4.0, 100.0)))
    st.apply(0.0, PlaceJob("j0001", "n0/0"))
    obs = Observer(None, DecisionLog(None))
    obs.lost_why = lambda g: "its agent restarted"
    obs.on_event(5.0, GpuRemoved("n0/0"), st)
    obs.on_event(9.0, GpuAdded("n0/0", "A100-40GB"), st)
    recs = obs.log.recent(10)
    assert [r["kind"] for r in recs] == ["GpuLost", "GpuJoined"]
    assert mentions(recs[0], job="j0001") and "its agent restarted" in describe(recs[0])
    assert "resume from their last checkpoint" in describe(recs[0])


def test_status_fits_80_columns_with_the_why_on_its_own_table() -> None:
    st = {"user": "root", "admin": True, "policy": "miso+", "gpus": [],
          "jobs": [{"id": "j0001", "name": "resnet-train", "state": "running",
                    "gpu": "node0/0", "placement": "4g.20gb@0", "rate": 12.3,
                    "iteration": 500, "total": 2000, "restarts": 1, "owner_name": "alice"},
                   {"id": "j0002", "name": "bert", "state": "queued", "restarts": 0,
                    "owner_name": "bob", "why": "waiting for a slice with 4.0 GiB; the "
                    "policy has not placed it (node0/0 running 1 job)"}]}
    con = Console(width=80, record=True)
    for t in render_status(st, width=80):
        con.print(t)
    out = con.export_text()
    assert max(len(x) for x in out.splitlines()) <= 80
    assert "resnet-train" in out and "node0/0 4g.20gb@0" in out and "25%" in out
    assert "waiting for a slice with 4.0 GiB" in " ".join(out.split())


def test_a_node_back_from_a_loss_is_forgotten_after_a_while() -> None:
    from miso.controller.statustext import RECENT_LOSS_S, lost_node, prune_losses

    lost = {"n0": {"since": 100.0, "why": "its agent restarted", "back": 110.0},
            "n1": {"since": 100.0, "why": "x"}}
    assert lost_node("n0", lost["n0"], False)["phase"] == "back"
    prune_losses(lost, now=110.0 + RECENT_LOSS_S - 1)
    assert set(lost) == {"n0", "n1"}
    prune_losses(lost, now=110.0 + RECENT_LOSS_S)
    assert set(lost) == {"n1"}
