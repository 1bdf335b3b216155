"""Issue 33: ``miso submit --profile 3g.20gb`` (a job pinned to one MIG profile) and
``--after JOB`` (not eligible until JOB ended, Slurm's ``afterany``), in the scheduling core
both drivers share (:mod:`miso.sched.pinning`, :mod:`miso.sched.dependencies`)."""

from __future__ import annotations

import threading

import pytest

from miso.sched import ApplyLayout, JobSubmitted, PlaceJob
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


def _trace(**extra: dict) -> list[TraceJob]:
    jobs = [TraceJob(str(i), 10.0 * i, 600.0 + 50 * i, "resnet_train128") for i in range(6)]
    return [TraceJob(**{**j.__dict__, **extra.get(j.id, {})}) for j in jobs]


@pytest.mark.parametrize("policy", ["miso+", "miso", "oracle"])
def test_a_job_pinned_to_a_profile_runs_on_that_profile_only(policy: str) -> None:
    jobs = _trace(**{"0": {"profile": "3g.20gb"}, "4": {"profile": "2g.10gb"}})
    r = run_policy(policy, jobs, WorldConfig(n_gpus=2, restart_s=30.0), 1, record=True)
    got: dict[str, set[str]] = {"0": set(), "4": set()}
    for _, d in r.log:
        if isinstance(d, ApplyLayout):
            for j, pl in d.assignment.items():
                if j in got:
                    got[j].add(pl.profile)
    assert got == {"0": {"3g.20gb"}, "4": {"2g.10gb"}}
    assert (r.finish > 0).all()
    # unpinned, job 0 alone on a GPU at first gets the whole GPU
    free = run_policy(policy, _trace(), WorldConfig(n_gpus=2, restart_s=30.0), 1, record=True)
    first = next(d for _, d in free.log if isinstance(d, ApplyLayout) and "0" in d.assignment)
    assert first.assignment["0"].profile != "3g.20gb"


@pytest.mark.parametrize("policy", ["miso+", "nopart"])
def test_a_job_after_another_is_placed_only_once_that_one_ended(policy: str) -> None:
    # job 5 waits for job 0 (the first to arrive, running long); 3 GPUs are free for it
    jobs = _trace(**{"5": {"after": ("0",)}, "0": {"duration_s": 3000.0}})
    r = run_policy(policy, jobs, WorldConfig(n_gpus=3, restart_s=30.0), 1, record=True)
    ids = r.job_ids
    end0 = r.finish[ids.index("0")]
    placed = next(t for t, d in r.log if isinstance(d, PlaceJob) and d.job == "5")
    arrived = next(t for t, e in r.log if isinstance(e, JobSubmitted) and e.job.id == "5")
    assert placed >= end0 and arrived == pytest.approx(end0)
    assert r.finish[ids.index("5")] > end0
    # without the dependency it starts before job 0 ends
    free = run_policy(policy, _trace(**{"0": {"duration_s": 3000.0}}),
                      WorldConfig(n_gpus=3, restart_s=30.0), 1, record=True)
    assert next(t for t, d in free.log if isinstance(d, PlaceJob) and d.job == "5") < \
        free.finish[free.job_ids.index("0")]


def test_a_chain_of_dependencies_runs_in_order_and_a_failed_one_releases_too() -> None:
    from miso.sched import ClusterState, GpuAdded, JobFailed, JobSpec, make_policy
    from miso.sched.driver import DriverStep

    st = ClusterState()
    step = DriverStep(st, make_policy("nopart"), execute=lambda *a: None)
    step(0.0, GpuAdded("g0", "A100-40GB"))
    step(0.0, JobSubmitted(JobSpec("a", "a", 5.0)))
    step(1.0, JobSubmitted(JobSpec("b", "b", 5.0, after=("a",))))
    step(2.0, JobSubmitted(JobSpec("c", "c", 5.0, after=("b",))))
    assert set(st.jobs) == {"a"} and step.dependencies.waiting() == {"b": ("a",),
                                                                      "c": ("b",)}
    step(3.0, JobFailed("a", "exit code 1"))  # afterany: a failure releases it too
    assert "b" in st.jobs and "c" not in st.jobs
    assert st.jobs["b"].submitted_at == 3.0
    step(4.0, JobSubmitted(JobSpec("d", "d", 5.0, after=("c",))))
    assert step.drop_held(5.0, "c")  # c cancelled while held: d waits for nothing now
    assert "d" in st.jobs and st.jobs["d"].submitted_at == 5.0
    assert step.dependencies.waiting() == {} and not step.drop_held(6.0, "c")


# ---- the live controller (in-memory store, virtual clock, plans accepted, no agents) --------


def _controller(policy: str = "miso+"):  # noqa: ANN202
    from helpers import AcceptingPlans

    from miso.controller import Controller, ControllerConfig
    from miso.controller.runtime import GpuRef
    from miso.controller.store import JobStore
    from miso.mig import geometry
    from miso.sched import GpuAdded, make_policy
    from miso.sched.clock import VirtualClock
    from miso.sched.estimators import make_estimator

    con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                     ControllerConfig(policy=policy, check_commands=False),
                     checkpoint_root="/nonexistent", clock=VirtualClock(),
                     policy=make_policy(policy, **({} if policy == "nopart" else {
                         "estimator": make_estimator("heuristic")})))
    con.loop.executor = AcceptingPlans()  # type: ignore[assignment]
    con.rt.gpus["g0"] = GpuRef("g0", "n0", 0, "A100-40GB", geometry("A100-40GB"))
    con.loop.handle(("event", GpuAdded("g0", "A100-40GB")))
    return con


def _drain(con) -> None:  # noqa: ANN001
    while con.loop.run_once():
        pass


def test_live_submit_profile_is_stored_checked_and_planned_on_that_profile() -> None:
    from miso.controller import SubmitError
    from miso.sched import LayoutApplied

    con = _controller()
    jid = con.submit(["train"], memory_gb=4.0, profile="3g.20gb")
    rec = con.store.get(jid)
    assert rec.profile == "3g.20gb" and rec.memory_gib == pytest.approx(19.5, abs=0.6)
    _drain(con)
    st = con.loop.state
    gs = st.gpus["g0"]
    if gs.pending is not None and not isinstance(gs.pending, ApplyLayout):
        pytest.fail(f"expected a plan, got {gs.pending}")
    con.loop.handle(("event", LayoutApplied("g0", gs.pending_plan_id)))
    _drain(con)
    assert st.jobs[jid].placement is not None
    assert st.jobs[jid].placement.profile == "3g.20gb"
    with pytest.raises(SubmitError, match="no GPU of this cluster has that MIG profile"):
        con.submit(["train"], profile="3g.40gb")
    with pytest.raises(SubmitError, match="asks for"):
        con.submit(["train"], memory_gb=30.0, profile="2g.10gb")


def test_live_submit_after_holds_the_job_until_its_dependency_ended_then_runs_it() -> None:
    from miso.controller import SubmitError
    from miso.sched import JobFinished

    con = _controller("nopart")
    first = con.submit(["train"], memory_gb=4.0, name="prep")
    _drain(con)
    second = con.submit(["train"], memory_gb=4.0, after=["prep"])
    third = con.submit(["train"], memory_gb=4.0, after=[second])
    _drain(con)
    assert con.store.get(second).after == [first]
    st = con.loop.state
    assert second not in st.jobs and third not in st.jobs
    jobs = {j["id"]: j for j in con.status()["jobs"]}
    assert jobs[second]["state"] == "queued"
    assert jobs[second]["why"] == f"waiting for job {first} to end (--after)"
    assert jobs[third]["why"] == f"waiting for job {second} to end (--after)"
    done = threading.Event()
    con.loop.handle(("cancel", third, done))  # the API's cancel; held: never delivered
    assert done.is_set()
    con.loop.handle(("event", JobFinished(first)))
    _drain(con)
    assert second in st.jobs and third not in st.jobs
    assert con.store.get(third).state == "cancelled"
    with pytest.raises(SubmitError, match="no such job"):
        con.submit(["train"], after=["nope"])


def test_api_and_cli_carry_profile_and_after(tmp_path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
                                             ) -> None:
    """``POST /api/v1/jobs`` takes ``profile`` and ``after`` (validated: 422 on a malformed
    profile, 400 on an unknown job) and the record shows them; ``miso submit --profile
    --after`` sends them."""
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    import miso.cli.client as cc
    from miso.api import UserStore, create_app
    from miso.cli.main import app as cli

    con = _controller("nopart")
    users = UserStore(tmp_path / "users.db")
    tok = {"Authorization": f"Bearer {users.add('ann', unix_user='nobody')}"}
    with TestClient(create_app(con, users, snapshot_ttl=0.0)) as c:  # type: ignore[arg-type]
        r = c.post("/api/v1/jobs", headers=tok, json={"command": ["true"], "name": "prep"})
        first = r.json()["id"]
        r = c.post("/api/v1/jobs", headers=tok, json={
            "command": ["true"], "profile": "2g.10gb", "after": ["prep"]})
        assert r.status_code == 201, r.text
        rec = c.get(f"/api/v1/jobs/{r.json()['id']}", headers=tok).json()["job"]
        assert rec["profile"] == "2g.10gb" and rec["after"] == [first]
        bad = c.post("/api/v1/jobs", headers=tok, json={"command": ["true"],
                                                         "profile": "big; rm -rf /"})
        assert bad.status_code == 422
        gone = c.post("/api/v1/jobs", headers=tok, json={"command": ["true"],
                                                          "after": ["nosuch"]})
        assert gone.status_code == 400 and "no such job" in gone.json()["error"]

    sent: dict[str, object] = {}

    class Fake:
        def __enter__(self) -> Fake:
            return self

        def __exit__(self, *a: object) -> None:
            return None

        def submit(self, command: list[str], **kw: object) -> str:
            sent.update(kw)
            return "j0009"

    monkeypatch.setattr(cc, "client", lambda *a, **k: Fake())
    r = CliRunner().invoke(cli, ["submit", "--profile", "3g.20gb", "--after", "j0001",
                                 "--after", "prep", "--", "/bin/true"])
    assert r.exit_code == 0, r.output
    assert sent["profile"] == "3g.20gb" and sent["after"] == ["j0001", "prep"]


def test_requeue_keeps_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import miso.cli.client as cc
    from miso.cli.main import app as cli

    sent: dict[str, object] = {}

    class Fake:
        def __enter__(self) -> Fake:
            return self

        def __exit__(self, *a: object) -> None:
            return None

        def job(self, job: str) -> dict:
            return {"id": "j0003", "name": "t", "state": "failed", "command": ["true"],
                    "env": {}, "cwd": "/w", "memory_gb": 21.5, "profile": "3g.20gb",
                    "after": ["j0001"]}

        def submit(self, command: list[str], **kw: object) -> str:
            sent.update(kw)
            return "j0010"

    monkeypatch.setattr(cc, "client", lambda *a, **k: Fake())
    r = CliRunner().invoke(cli, ["requeue", "j0003"])
    assert r.exit_code == 0, r.output
    assert sent["profile"] == "3g.20gb" and "after" not in sent  # its dependencies ended
