"""Time limits and the non-checkpointing hold (issue 26, item 5): ``miso submit --time`` in
Slurm's formats, a maximum per owner (its jobs' default), a job past its limit checkpointed
(when it saves) and ended, a wait behind jobs that cannot checkpoint named, and fair share
allowed by the operator to stop such jobs after a grace time."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from helpers import FAST, emu
from waiting import wait_for

from miso.controller.timelimits import TimeLimitStore, run_time
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig
from miso.timelimit import format_time, parse_time


def test_parse_time__slurm_formats_and_one_line_refusals() -> None:
    assert parse_time("30") == 1800
    assert parse_time("5:30") == 330
    assert parse_time("1:02:03") == 3723
    assert parse_time("2-3") == 2 * 86400 + 3 * 3600
    assert parse_time("1-00:30") == 86400 + 1800
    assert parse_time("1-00:00:05") == 86405
    for bad in ("", "0", "0:00", "１0", "1_0", "-5", "1.5", "1:2:3:4", "400-00", "abc"):
        with pytest.raises(ValueError) as e:
            parse_time(bad)
        assert "\n" not in str(e.value)
    assert format_time(3723) == "01:02:03" and format_time(86405) == "1-00:00:05"


def test_store__owner_maximum_is_default_and_bound_and_survives(tmp_path: Path) -> None:
    db = tmp_path / "miso.db"
    s = TimeLimitStore(db)
    assert s.limit_for("u:a", None) is None
    s.set_max_time("u:a", 3600.0)
    assert s.limit_for("u:a", None) == 3600.0
    assert s.limit_for("u:a", 60.0) == 60.0
    with pytest.raises(ValueError, match="above the maximum of 01:00:00"):
        s.limit_for("u:a", 7200.0)
    with pytest.raises(ValueError):
        s.set_max_time("u:a", True)  # type: ignore[arg-type]
    s.set_job("j0001", 60.0)
    s.close()
    again = TimeLimitStore(db)
    assert again.jobs() == {"j0001": 60.0} and again.max_time("u:a") == 3600.0
    again.forget(["j0001"])
    assert again.jobs() == {}


def test_run_time__ended_attempts_count_and_the_live_one_too() -> None:
    atts = [{"attempt": 1, "started_at": 10.0, "ended_at": 40.0},
            {"attempt": 2, "started_at": 50.0, "ended_at": None}]
    assert run_time(atts, 2, 1000.0, 1005.0) == pytest.approx(35.0)


def test_live__past_its_limit_a_saving_job_is_checkpointed_and_ended_others_ended() -> None:
    from miso.agent import Agent
    from miso.backend.emulated import EmulatedBackend
    from miso.controller import Controller, ControllerConfig, SubmitError
    from miso.controller.storefile import open_store
    from miso.transport.inprocess import LocalTransport

    d = Path(tempfile.mkdtemp(prefix="miso-time-"))
    transport = LocalTransport()
    transport.add(Agent("node0", EmulatedBackend(2, node="node0"), d / "agents" / "node0",
                        no_helper_after=0.3))
    ctl = Controller(open_store(d), transport,
                     ControllerConfig(**{**FAST, "checkpoint_timeout": 3.0}),  # type: ignore[arg-type]
                     checkpoint_root=d / "checkpoints")
    ctl.start()
    try:
        ctl.time_limits.set_max_time("u:x", 60.0)
        with pytest.raises(SubmitError, match="above the maximum"):
            ctl.submit(["sleep", "1"], owner="u:x", owner_name="x", time_limit_s=120.0)
        saver = ctl.submit(emu("resnet_train128", 600.0), time_limit_s=2.0)
        plain = ctl.submit(["sleep", "600"], time_limit_s=2.0)
        free = ctl.submit(["sleep", "2"])
        for j in (saver, plain):
            wait_for(lambda j=j: ctl.store.get(j).state == "failed", 20)
            rec = ctl.store.get(j)
            assert rec.reason.startswith("time limit 00:00:02 reached"), rec.reason
        assert ctl.store.get(saver).checkpoint_iteration  # it saved before it ended
        wait_for(lambda: ctl.store.get(free).state == "finished", 20)
        assert ctl.loop.health() == []
    finally:
        ctl.stop(stop_jobs=True)
        ctl.store.close()
        transport.agents()["node0"].shutdown()
        shutil.rmtree(d, ignore_errors=True)


def test_live__requeue_at_the_limit_a_saving_job_resumes_from_its_checkpoint() -> None:
    """With ``ControllerConfig(time_limit_action="requeue")`` (``miso cluster up
    --at-time-limit requeue``) a job that saves is checkpointed at its limit, goes back to the
    queue and resumes from its checkpoint (its limit counts per run, a time slice); one that
    cannot save is still ended. Before: both ended, ``failed``."""
    from miso.agent import Agent
    from miso.backend.emulated import EmulatedBackend
    from miso.controller import Controller, ControllerConfig
    from miso.controller.storefile import open_store
    from miso.transport.inprocess import LocalTransport

    d = Path(tempfile.mkdtemp(prefix="miso-time-"))
    transport = LocalTransport()
    transport.add(Agent("node0", EmulatedBackend(2, node="node0"), d / "agents" / "node0",
                        no_helper_after=0.3))
    cfg = ControllerConfig(**{**FAST, "checkpoint_timeout": 3.0},  # type: ignore[arg-type]
                           time_limit_action="requeue")
    ctl = Controller(open_store(d), transport, cfg, checkpoint_root=d / "checkpoints")
    ctl.start()
    try:
        saver = ctl.submit(emu("resnet_train128", 6.0), time_limit_s=2.0)
        plain = ctl.submit(["sleep", "600"], time_limit_s=2.0)
        wait_for(lambda: ctl.store.get(plain).state == "failed", 20)
        assert ctl.store.get(plain).reason.startswith("time limit 00:00:02 reached")
        wait_for(lambda: ctl.store.get(saver).state in ("finished", "failed"), 60)
        rec = ctl.store.get(saver)
        assert rec.state == "finished", rec.reason
        atts = ctl.store.attempts(saver)
        assert len(atts) >= 2, atts
        assert any(a.get("start_iteration") for a in atts[1:]), atts  # resumed, not anew
        assert ctl.loop.health() == []
    finally:
        ctl.stop(stop_jobs=True)
        ctl.store.close()
        transport.agents()["node0"].shutdown()
        shutil.rmtree(d, ignore_errors=True)


def test_cli__at_time_limit_takes_end_or_requeue_only(tmp_path: Path, monkeypatch: Any) -> None:
    import typer
    from typer.testing import CliRunner

    from miso import raycluster
    from miso.cli import app
    from miso.cli.cluster import time_limit_action

    assert time_limit_action("end") == "end" and time_limit_action("requeue") == "requeue"
    with pytest.raises(typer.Exit):
        time_limit_action("pause")
    # an operator's setting: the config file takes it too (checked before anything starts)
    monkeypatch.setattr(raycluster, "spawn_local_head", lambda *a, **k: 1 / 0)
    monkeypatch.setenv("MISO_STATE_DIR", str(tmp_path / "sd"))
    cfg = tmp_path / "cluster.toml"
    cfg.write_text('emulated = true\nat-time-limit = "pause"\n')
    r = CliRunner().invoke(app, ["cluster", "up", "--config", str(cfg)])
    assert r.exit_code == 2 and "--at-time-limit 'pause': expected end or requeue" in r.output, \
        r.output


def test_why__a_waiting_owner_is_told_whose_jobs_cannot_be_moved() -> None:
    """Two jobs of bob that do not checkpoint hold both GPUs: alice's queued job says so -
    by name to an admin, as "another user's jobs" to anyone else (before: only "the policy
    has not placed it")."""
    from miso.controller.statustext import why

    snap = {"gpus": [{"id": "g0", "phase": "running", "jobs": ["b1"]},
                     {"id": "g1", "phase": "running", "jobs": ["b2"]}]}
    owners = {"b1": "bob", "b2": "bob", "a1": "alice"}
    a = {"id": "a1", "state": "queued", "owner_name": "alice", "memory_gib": 4.0}
    pinned = {"b1", "b2"}.__contains__
    line = why(a, snap, pinned, admin=True, owner_of=owners.get)
    assert line.endswith(": bob's 2 jobs cannot be moved (they do not checkpoint)"), line
    line = why(a, snap, pinned, owner_of=owners.get)
    assert line.endswith(": another user's jobs cannot be moved (they do not checkpoint)")
    assert "bob" not in line
    # her own pinned jobs, or jobs that checkpoint, are no such cause
    assert "cannot be moved" not in why(a, snap, set().__contains__, owner_of=owners.get)
    mine = {"b1": "alice", "b2": "alice"}.get
    assert "cannot be moved" not in why(a, snap, pinned, admin=True, owner_of=mine)


@pytest.mark.parametrize("policy", ["miso", "miso+"])
def test_fair_share__an_operator_lets_it_stop_jobs_that_cannot_checkpoint_after_a_grace(
        policy: str) -> None:
    """Owner H's 14 jobs that cannot checkpoint hold both GPUs; L submits one job. Without
    the setting L waits for H's jobs to end; with ``--stop-uncheckpointable-after 600`` fair
    share requeues H's jobs (they lose their progress) once they ran 600 s. (miso+ before
    the fix: its room test ignored its pinned residents - one job that cannot checkpoint on
    each GPU - so reclaim saw room for L that placement then refused, and requeued nothing.)"""
    from miso.cli.cluster import tenancy_options
    from miso.sched import RequeueJob

    opts = tenancy_options(True, None, False, None, stop_uncheckpointable_after=600.0)
    assert opts is not None and opts["preempt_uncheckpointable"] and opts["min_run_s"] == 600
    jobs = [TraceJob(f"h{i:02d}", float(i), 20000.0, "resnet_train64", "H") for i in range(14)]
    jobs.append(TraceJob("l", 1000.0, 2000.0, "resnet_train64", "L"))
    cfg = WorldConfig(n_gpus=2, no_checkpoint_frac=1.0)
    held = run_policy(policy, jobs, cfg, record=True, tenancy=TenancyConfig(min_run_s=600.0))
    freed = run_policy(policy, jobs, cfg, record=True, tenancy=TenancyConfig(
        min_run_s=opts["min_run_s"], preempt_uncheckpointable=True))
    assert not [d for _, d in held.log if isinstance(d, RequeueJob)]
    stopped = [(t, d) for t, d in freed.log if isinstance(d, RequeueJob)]
    assert stopped and min(t for t, _ in stopped) >= 600.0
    assert all(d.job.startswith("h") for _, d in stopped)
    jct = dict(zip(freed.job_ids, freed.jct, strict=True))["l"]
    assert jct < 0.2 * dict(zip(held.job_ids, held.jct, strict=True))["l"]


def test_cli__submit_time_and_quota_max_time_refuse_a_bad_limit_in_one_line() -> None:
    from helpers import run_cli

    r = run_cli("submit", "--time", "1_0", "--", "/bin/true")
    assert r.exit_code != 0 and "time limit '1_0': expected MM, MM:SS" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = run_cli("quota", "set", "alice", "--max-time", "forever")
    assert r.exit_code != 0 and "time limit 'forever'" in r.output


def test_core__a_job_stopped_outside_the_policy_is_queued_and_placed_again() -> None:
    """``JobStopped`` (the live requeue at a time limit): the job leaves its GPU for the
    queue, the policy hears of the room and places it again; a stale one (another GPU) is
    dropped."""
    from miso.sched import ClusterState, GpuAdded, JobSpec, JobStopped, JobSubmitted
    from miso.sched.decisions import ApplyLayout, PlaceJob
    from miso.sched.driver import DriverStep
    from miso.sched.events import LayoutApplied
    from miso.sched.policies import make_policy

    st = ClusterState()
    out: list[object] = []
    step = DriverStep(st, make_policy("nopart"), execute=lambda now, d, ctx: out.append(d))
    step(0.0, GpuAdded("g0", "A100-40GB"))
    step(1.0, JobSubmitted(JobSpec("a", "a", 4.0, "resnet_train64")))
    plan = next(d for d in out if isinstance(d, ApplyLayout))
    step(1.0, LayoutApplied("g0", plan.plan_id))
    assert st.jobs["a"].gpu == "g0" and str(st.jobs["a"].status) == "running"
    assert not step(5.0, JobStopped("a", "g9", "time limit"))  # not where it runs: stale
    out.clear()
    assert step(5.0, JobStopped("a", "g0", "time limit"))
    assert st.jobs["a"].restarts == 1
    assert [d for d in out if isinstance(d, PlaceJob)] == [PlaceJob("a", "g0")]
