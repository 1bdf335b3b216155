"""Controller reliability on the emulated backend, in-process (no Ray): real job processes,
the shared scheduling core deciding, SQLite store; crashes, lost nodes, failed reconfigurations
and bad input."""

from __future__ import annotations

import os
import sqlite3
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers import FAST as BASE_FAST
from helpers import emu
from waiting import wait_for

from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig, JobStore, StoreError, SubmitError
from miso.mig import Placement, geometry, violations

FAST = {**BASE_FAST, "lease_s": 2.0}



@pytest.fixture
def make_cluster(tmp_path: Path):  # noqa: ANN201
    made: list[LocalCluster] = []

    def make(**kw: Any) -> LocalCluster:
        cfg = ControllerConfig(**{**FAST, **kw.pop("config", {})})
        c = LocalCluster(tmp_path / f"c{len(made)}", config=cfg, rate_window=0.5, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        pids = [p for a in c.transport.agents().values() for p in a.running_pids()]
        c.close()
        for p in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(p, 0)


def check_run(c: LocalCluster, store: JobStore) -> None:
    """All jobs finished exactly once; every applied layout valid; no lost progress."""
    jobs = store.jobs()
    assert all(j.state == "finished" for j in jobs), [(j.id, j.state, j.reason) for j in jobs]
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in store.attempts():
        by_job[a["job"]].append(a)
    for j in jobs:
        atts = by_job[j.id]
        assert sum(a["status"] == "finished" for a in atts) == 1, atts
        assert j.iteration == j.total
        saved = None
        for a in atts:
            if a["start_iteration"] is not None and saved is not None:
                # each attempt resumes from the last checkpoint saved before it (or a later
                # one the dying attempt wrote after its last report): no progress is lost
                assert a["start_iteration"] >= saved, (j.id, atts)
            if a["checkpoint_iteration"] is not None:
                saved = a["checkpoint_iteration"]
    for row in store.layouts():
        lay = [Placement(s, p) for s, p in row["layout"]]
        assert not violations(geometry(row["model"]), lay), row
    for be in c.backends.values():
        for gpu, lay in be.history:
            assert not violations(be.geometry(gpu), lay)


def test_controller__twenty_jobs_arriving_over_time_on_four_gpus(make_cluster) -> None:
    # profile_when="always": this run covers the live profiling path too (by default miso+
    # profiles a newcomer only once the arrivals show a busy cluster)
    c = make_cluster(gpus_per_node=4, config={"policy_args": {"profile_when": "always"}})
    wls = ["resnet_train128", "bert_train2", "gnn_train512", "mobilenet_train128",
           "transformer_train32", "cyclegan_train1", "embedding_train128"]
    for i in range(20):
        c.submit(emu(wls[i % len(wls)], 1.0 + 0.5 * (i % 3)), name=f"job{i}")
        time.sleep(0.2)
    ctl = c.controller
    assert ctl.wait_all(150), ctl.status()
    check_run(c, ctl.store)
    # the policy really partitioned GPUs (more than one instance at some point)
    assert any(len(r["layout"]) > 1 for r in ctl.store.layouts())
    assert ctl.store.events("ProfilingFinished")
    assert not ctl.errors


def test_controller__crash_and_restart_recovers_from_the_store(make_cluster) -> None:
    c = make_cluster(gpus_per_node=2)
    for i, wl in enumerate(["resnet_train128", "bert_train2", "gnn_train512", "gnn_train64"]):
        c.submit(emu(wl, 1.5 if i == 3 else 4.0, "--checkpoint-every", "0.5"))
    ctl = c.controller
    wait_for(lambda: sum(j.state == "running" for j in ctl.store.jobs()) >= 2, 30)
    c.crash_controller()  # no clean-up: threads stop, jobs keep running on the agents
    time.sleep(2.0)  # the short job finishes while nobody watches
    ctl = c.start_controller()
    assert ctl.store.events("recovered")
    assert ctl.wait_all(90), ctl.status()
    check_run(c, ctl.store)


def test_controller__lost_node_requeues_jobs_from_their_checkpoints(make_cluster) -> None:
    c = make_cluster(nodes=2, gpus_per_node=1)
    for wl in ["resnet_train128", "bert_train2", "gnn_train512", "mobilenet_train128"]:
        c.submit(emu(wl, 4.0, "--checkpoint-every", "0.4"))
    ctl = c.controller
    wait_for(lambda: any(j.state == "running" and (j.gpu or "").startswith("node1")
                         and (j.checkpoint_iteration or 0) > 0 for j in ctl.store.jobs()), 40)
    c.transport.remove("node1")  # the node dies with its processes
    assert ctl.wait_all(90), ctl.status()
    check_run(c, ctl.store)
    lost = [a for a in ctl.store.attempts() if a["status"] == "lost"]
    assert lost
    for a in lost:
        later = [b for b in ctl.store.attempts(a["job"]) if b["attempt"] > a["attempt"]]
        assert later and all(b["node"] == "node0" for b in later)
    assert ctl.store.events("node-lost")


@pytest.mark.parametrize("op", ["create", "destroy"])
def test_controller__failed_reconfiguration_ends_valid_and_jobs_finish(make_cluster,
                                                                      op: str) -> None:
    c = make_cluster(gpus_per_node=1)
    be = c.backends["node0"]
    ctl = c.controller
    c.submit(emu("resnet_train128", 2.0))
    wait_for(lambda: any(j.state == "running" for j in ctl.store.jobs()), 20)
    be.fail_next(op, "INSUFFICIENT_RESOURCES" if op == "create" else "UNKNOWN")
    c.submit(emu("bert_train2", 1.5))
    c.submit(emu("gnn_train512", 1.5))
    assert ctl.wait_all(90), ctl.status()
    check_run(c, ctl.store)
    assert ctl.store.events("layout-failed")
    assert ctl.store.events("LayoutFailed")


def test_controller__bad_input_is_refused_or_fails_with_a_reason(make_cluster) -> None:
    c = make_cluster(gpus_per_node=1)
    ctl = c.controller
    with pytest.raises(SubmitError, match="unknown command"):
        c.submit(["no-such-trainer-binary", "--x"])
    with pytest.raises(SubmitError, match="largest slice"):
        c.submit(["true"], memory_gb=80)
    with pytest.raises(SubmitError, match="no command"):
        c.submit([])
    ok = c.submit(emu("gnn_train64", 1.0), name="dup")
    with pytest.raises(SubmitError, match="already active"):
        c.submit(["true"], name="dup")
    bad = c.submit(emu("bert_train2", 1.0, "--crash-at-start"), name="crasher")
    assert ctl.wait_all(60), ctl.status()
    assert ctl.store.get(ok).state == "finished"
    rec = ctl.store.get(bad)
    assert rec.state == "failed" and "crashing at start" in rec.reason
    # names stay unique after a job ended: `logs dup` / `cancel dup` keep meaning one job
    with pytest.raises(SubmitError, match="already exists .*finished"):
        c.submit(["true"], name="dup")
    # a failed job's name is free again; the name then means the new job
    retry = c.submit(emu("gnn_train64", 0.5), name="crasher")
    assert retry != bad and ctl.store.get("crasher").id == retry
    # the cluster keeps running: a new job still completes
    again = c.submit(emu("gnn_train64", 0.5), name="dup2")
    assert ctl.wait_all(60)
    assert ctl.store.get(again).state == "finished"
    assert "crashing at start" in ctl.logs(bad)


def test_controller__cancel_kills_the_job(make_cluster) -> None:
    c = make_cluster(gpus_per_node=1)
    ctl = c.controller
    j = c.submit(emu("resnet_train128", 60.0))
    wait_for(lambda: ctl.store.get(j).state == "running", 20)
    rec = ctl.cancel(j)
    assert rec["state"] == "cancelled"
    agent = c.transport.agents()["node0"]
    wait_for(lambda: not agent.running_pids(), 10)
    with pytest.raises(SubmitError):
        ctl.cancel(j)
    st = ctl.status()
    assert st["jobs"][0]["state"] == "cancelled"


def test_controller__phase_change_is_reported_to_the_policy(make_cluster) -> None:
    c = make_cluster(gpus_per_node=1, config={"reprofile_cooldown_s": 0.0})
    ctl = c.controller
    c.submit(emu("resnet_train128", 3.0, "--phase-at", "0.4", "--phase-factor", "0.4"))
    assert ctl.wait_all(60)
    ev = ctl.store.events("JobSpeedChanged")
    assert ev and ev[0]["body"]["observed"] < 0.7 * ev[0]["body"]["baseline"]
    assert ctl.store.events("SpeedObserved")


def test_controller__job_profiled_alone_keeps_running_on_the_whole_gpu(make_cluster) -> None:
    """Sim/live parity of restarts: a job profiled alone ends its run under MPS at 100 % and
    keeps running when the plan gives it the whole GPU (the simulator charges no restart
    there): two attempts (the 14 % and 100 % levels), not a third after profiling."""
    c = make_cluster(gpus_per_node=1, config={"policy_args": {"profile_when": "always"}})
    ctl = c.controller
    job = c.submit(emu("resnet_train128", 3.0))
    assert ctl.wait_all(60), ctl.status()
    assert ctl.store.events("ProfilingFinished")
    check_run(c, ctl.store)
    atts = [a for a in ctl.store.attempts() if a["job"] == job]
    assert [a["mps_pct"] for a in atts] == [14, 100], atts


def test_controller__miso_plus_measures_a_live_restart_from_the_relaunch(make_cluster) -> None:
    """Restart cost measured, not told: a running job moved into a slice when a second one
    joins its GPU; the policy reads its cost from the plan to the new attempt's first
    progress report, at least the job's own warm-up (1.5 s) and not a last report of the
    stopped attempt."""
    c = make_cluster(gpus_per_node=1, config={"policy_args": {"profile_when": "never",
                                                              "wait_for_gpu": False}})
    ctl = c.controller
    a = c.submit(emu("resnet_train128", 6.0, "--restart-s", "1.5"))
    wait_for(lambda: any(j.state == "running" for j in ctl.store.jobs()), 30)
    time.sleep(1.0)
    c.submit(emu("bert_train2", 3.0, "--restart-s", "1.5"))
    seen: dict[str, float] = {}
    pol = ctl.loop.policy
    wait_for(lambda: seen.update(pol.restarts.seen) or a in seen, 60)
    assert seen[a] >= 1.5, seen
    assert ctl.wait_all(60), ctl.status()


def test_store__schema_versioned_and_finish_exactly_once(tmp_path: Path) -> None:
    s = JobStore(tmp_path / "m.db")
    assert s.schema_version == 2
    epoch = s.epoch
    r = s.submit(command=["true"], name="a", memory_gb=1.0)
    assert r.state == "queued" and r.id == "j0001"
    assert s.finish(r.id, "finished", at=1.0)
    assert not s.finish(r.id, "failed", at=2.0)
    s.update(r.id, state="running")  # terminal jobs are frozen
    assert s.get(r.id).state == "finished" and s.get("a").id == r.id
    with pytest.raises(StoreError):
        s.get("nope")
    s.close()
    s2 = JobStore(tmp_path / "m.db")
    assert s2.epoch == epoch and s2.submit(command=["true"], name=None,
                                           memory_gb=1).id == "j0002"
    s2.close()
    db = sqlite3.connect(tmp_path / "m.db")
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        JobStore(tmp_path / "m.db")


def _job(state: str, **kw: object) -> dict[str, object]:
    return {"id": "j2", "state": state, "note": None, "checkpointable": None,
            "iteration": None, "memory_gib": 4.0, **kw}


def _snap(phase: str, jobs: list[str]) -> dict[str, object]:
    return {"gpus": [{"id": "node0/0", "phase": phase, "jobs": jobs}], "unreachable": []}


def test_why__a_job_without_progress_reports_is_said_to_be_not_profiled() -> None:
    from miso.controller.statustext import why

    snap = _snap("running", ["j2"])
    # the default policy never profiles it: still, status says so
    assert why(_job("running", checkpointable=False), snap) == \
        "not profiled: no progress reports"
    assert why(_job("running", checkpointable=True, iteration=5, note="x"), snap) == "x"
    # --policy miso runs it in a profiling run: never "profiling" and "not profiled" at once
    line = why(_job("profiling", checkpointable=False), _snap("profiling", ["j2"]))
    assert "not profiled" not in line and "not measured" in line
    # slow to start (the note was written), then it reported progress: no stale note
    late = _job("profiling", checkpointable=True, iteration=40,
                note="not profiled: no progress reports")
    assert why(late, _snap("profiling", ["j2"])) == ""
    assert why({**late, "state": "running"}, snap) == ""


def test_why__a_queued_job_is_told_the_true_cause_of_its_wait() -> None:
    from miso.controller.statustext import why

    q = _job("queued")
    pinned = _snap("running", ["j1", "j2"])
    line = why(q, pinned, {"j1"}.__contains__)
    assert "cannot checkpoint" in line and "j1" not in line
    assert "reconfiguration or profiling" not in line
    assert "being profiled" in why(q, _snap("profiling", ["j1", "j2"]))
    assert "layout is being changed" in why(q, _snap("reconfiguring", ["j1", "j2"]))
    assert "not applied yet" in why(q, pinned, set().__contains__)


def test_failure_cause_is_the_exception_line_not_a_cut_piece() -> None:
    from miso.controller.poller import failure_cause

    tb = """  File "/x/train.py", line 8, in <module>
    model = torch.nn.Linear(512, 10).cuda()
            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/v/torch/cuda/__init__.py", line 403, in _lazy_init
    raise AssertionError("Torch not compiled with CUDA enabled")
AssertionError: Torch not compiled with CUDA enabled
"""
    assert failure_cause(tb) == "AssertionError: Torch not compiled with CUDA enabled"
    assert failure_cause("starting\nout of data: stop\n\n") == "out of data: stop"
    assert failure_cause("") == ""
