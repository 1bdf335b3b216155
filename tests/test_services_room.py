"""Room for a service replica (issue 29): the head's replica jobs are queued ahead of every
other job, and a replica that waits for a slice gets one by a training job checkpointed for it,
which resumes later. The choice of that job (:mod:`miso.sched.replicaroom`) and the queue order
without a cluster; the whole path on a one-process emulated cluster (slow)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import emu_iterations, service_cluster
from pydantic import ValidationError
from waiting import wait_for

from miso.api.models import SubmitRequest
from miso.cluster.local import LocalCluster
from miso.controller.services import ServiceManager
from miso.controller.servicestore import ServiceRecord
from miso.jobstatus import JobStatus as StoreStatus
from miso.mig.layouts import Placement, geometry
from miso.sched.events import JobSpec, JobStopped, JobSubmitted
from miso.sched.replicaroom import holds, room_victim
from miso.sched.state import ClusterState, GpuState, JobStatus


def _state(residents: dict[str, list[tuple[str, float, bool, str]]]) -> ClusterState:
    """GPUs with running jobs: gpu -> [(job, GiB, ahead, profile)]."""
    st = ClusterState()
    for g, jobs in residents.items():
        gs = st.gpus[g] = GpuState(g, geometry("A100-40GB", None, None))
        for k, (j, mem, ahead, prof) in enumerate(jobs):
            st.observe(float(k), JobSubmitted(JobSpec(j, j, mem, ahead=ahead)))
            st.queue.remove(j)
            js = st.jobs[j]
            js.gpu, js.status, js.placement = g, JobStatus.RUNNING, Placement(0, prof)
            gs.jobs.append(j)
    return st


def test_replica_jobs_queue_ahead_and_a_requeued_training_job_stays_behind() -> None:
    st = ClusterState()
    st.gpus["g0"] = GpuState("g0", geometry("A100-40GB", None, None))
    st.observe(0.0, JobSubmitted(JobSpec("t1", "train", 9.0)))
    st.observe(1.0, JobSubmitted(JobSpec("t2", "train2", 9.0)))
    st.observe(2.0, JobSubmitted(JobSpec("r1", "svc-1", 10.5, ahead=True)))
    st.observe(3.0, JobSubmitted(JobSpec("r2", "svc-2", 10.5, ahead=True)))
    assert st.queue == ["r1", "r2", "t1", "t2"]
    # t1 placed and running, then checkpointed for a replica: back behind the replicas
    st.queue.remove("t1")
    st.jobs["t1"].gpu, st.jobs["t1"].status = "g0", JobStatus.RUNNING
    st.gpus["g0"].jobs.append("t1")
    st.observe(4.0, JobStopped("t1", "g0", "room for r1"))
    assert st.queue == ["r1", "r2", "t1", "t2"]


def test_without_replicas_the_queue_is_submission_order() -> None:
    st = ClusterState()
    for k, j in enumerate(["a", "b", "c"]):
        st.observe(float(k), JobSubmitted(JobSpec(j, j, 5.0)))
    assert st.queue == ["a", "b", "c"]


def test_the_api_cannot_ask_to_be_queued_ahead() -> None:
    assert SubmitRequest.model_validate({"command": ["true"]}).command == ["true"]
    with pytest.raises(ValidationError, match="ahead"):  # no such field for a user
        SubmitRequest.model_validate({"command": ["true"], "ahead": True})


def test_holds_a_layout_for_memory_demands() -> None:
    geom = geometry("A100-40GB", None, None)
    assert holds(geom, [9.0, 10.5])            # 4g.20gb + 3g.20gb
    assert holds(geom, [10.5, 10.5])           # 3g + 3g
    assert not holds(geom, [9.0, 10.5, 10.5])  # two 20 GiB slices and a 10 GiB one: no
    assert holds(geom, [9.0, 9.0, 10.5])       # 2g + 2g + 3g


def test_the_victim_frees_room_packs_replicas_and_costs_least() -> None:
    st = _state({
        "g0": [("t0", 9.0, False, "4g.20gb"), ("r0", 10.5, True, "3g.20gb")],
        "g1": [("t1", 9.0, False, "7g.40gb")],
    })
    st.observe(9.0, JobSubmitted(JobSpec("r1", "svc", 10.5, ahead=True)))
    assert room_victim(st, "r1") is None  # g1 holds t1 and the replica: the policy's room
    st = _state({
        "g0": [("t0", 9.0, False, "4g.20gb"), ("r0", 10.5, True, "3g.20gb")],
        "g1": [("t1", 9.0, False, "4g.20gb"), ("x1", 10.5, False, "3g.20gb")],
    })
    st.observe(9.0, JobSubmitted(JobSpec("r1", "svc", 10.5, ahead=True)))
    assert room_victim(st, "r1") == "t0"   # beside a replica; never the replica itself
    st.jobs["t0"].spec = JobSpec("t0", "t0", 9.0, checkpointable=False)
    assert room_victim(st, "r1") == "x1"   # t0 cannot checkpoint; x1 (3g) costs less than t1
    st.gpus["g1"].pending = object()  # type: ignore[assignment]  # a plan in flight
    assert room_victim(st, "r1") is None


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, ServiceManager]]:
    with service_cluster(tmp_path, gpus_per_node=1) as got:
        yield got


@pytest.mark.slow  # ~12 s on 2 busy cores
def test_a_training_job_is_checkpointed_for_a_replica_and_resumes(cluster) -> None:  # noqa: ANN001
    c, mgr = cluster
    ctl = c.controller
    train = ctl.submit(emu_iterations("resnet_train128", 1_000_000, 40.0), name="train")
    wait_for(lambda: ctl.store.get(train).state == StoreStatus.RUNNING, 30)
    rec = ServiceRecord(name="svc", model="resnet50", slo_p99_ms=100, min_replicas=1,
                        max_replicas=2, command=["python", "-m", "miso.emuserve", "--model",
                                                 "resnet50", "--load-s", "0.2"])
    mgr.serve(rec)

    def ticking(pred, timeout: float = 60.0):  # noqa: ANN001, ANN202
        def step():  # noqa: ANN202
            mgr.tick()
            return pred()
        return wait_for(step, timeout)

    ticking(lambda: mgr.view("svc")["ready_replicas"] == 1)
    ticking(lambda: ctl.store.get(train).state == StoreStatus.RUNNING)
    # the service asks for one more replica: the one GPU holds no third job of this size
    live = mgr.get("svc")
    assert live is not None
    mgr.scaling.apply(live, mgr.scaler.rate(time.monotonic(), "svc", 10_000.0))
    ticking(lambda: len(mgr.view("svc")["replicas"]) == 2)
    ticking(lambda: mgr.view("svc")["ready_replicas"] == 2, 90)
    t = ctl.store.get(train)
    assert t.state == StoreStatus.QUEUED  # checkpointed and requeued behind the replica
    (room,) = [e for e in ctl.store.events("replica-room") if e["body"]["job"] == train]
    assert "checkpointed to make room for service replica" in room["body"]["reason"]
    # the service ends: the training job resumes from its checkpoint
    mgr.stop("svc")
    ticking(lambda: not mgr.view("svc")["replicas"])
    wait_for(lambda: ctl.store.get(train).state == StoreStatus.RUNNING, 60)
    assert ctl.store.get(train).checkpoint_iteration


def test_with_tenancy_replica_jobs_stay_ahead_of_priority_and_fair_share() -> None:
    from miso.sched.tenancyconfig import TenancyConfig

    st = ClusterState(TenancyConfig(fair_share=True))
    st.observe(0.0, JobSubmitted(JobSpec("u1", "u1", 5.0, owner="bob", priority=100)))
    st.observe(1.0, JobSubmitted(JobSpec("u2", "u2", 5.0, owner="carol")))
    st.observe(2.0, JobSubmitted(JobSpec("r1", "svc", 10.5, owner="alice", ahead=True)))
    assert st.tenancy is not None
    assert st.tenancy.order(st.queue)[0] == "r1"
    assert st.tenancy.order(["u2", "u1"]) == ["u1", "u2"]  # without replicas: as before
