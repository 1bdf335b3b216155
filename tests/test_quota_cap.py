"""In-use quotas are caps (issue 26, item 4): an owner with ``max_in_use`` 0.5 on an idle
cluster never holds more than 0.5 GPU-equivalents, though its job was admitted for its smallest
slice and the optimizer would have given it a whole GPU."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import FAST, emu
from waiting import wait_for

from miso.sched.quotacap import capped_speeds
from miso.sched.state import ClusterState
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.run import run_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig


def _emu_job(work_s: float) -> dict[str, Any]:
    """An emulated job as a body of ``POST /jobs`` (as root, users' jobs run as ``nobody``,
    who cannot reach this venv's Python: the system's Python runs it from the source tree)."""
    import miso

    cmd = emu("resnet_train128", work_s)
    if os.geteuid() != 0:
        return {"command": cmd}
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no system python3 for jobs run as nobody")
    return {"command": [system, *cmd[1:]],
            "env": {"PYTHONPATH": str(Path(miso.__file__).resolve().parents[1])}}


def _peak_held(owner: str) -> tuple[dict[str, float], Any]:
    """(peak, observer): the most ``owner`` held over the run, after every decision."""
    peak = {"in_use": 0.0}

    def observer(pol: Any) -> None:
        real = pol.decide

        def decide(now: float, ev: Any, state: ClusterState) -> Any:
            if state.tenancy is not None:   # the ledger as the last decision left it
                peak["in_use"] = max(peak["in_use"], state.tenancy.in_use.get(owner, 0.0))
            return real(now, ev, state)

        pol.decide = decide

    return peak, observer


@pytest.mark.parametrize("policy", ["miso+", "miso"])
def test_sim__an_owner_capped_at_half_a_gpu_never_holds_more_on_an_idle_cluster(
        policy: str) -> None:
    peak, obs = _peak_held("U")
    jobs = [TraceJob("u1", 0.0, 600.0, "resnet_train64", "U")]
    r = run_policy(policy, jobs, WorldConfig(n_gpus=2), observer=obs,
                   tenancy=TenancyConfig(max_in_use={"U": 0.5}))
    assert r.finish[0] > 0
    assert 0.0 < peak["in_use"] <= 0.5 + 1e-9, peak
    # without the cap the same job takes a whole GPU (what the cap prevents)
    free, obs2 = _peak_held("U")
    run_policy(policy, jobs, WorldConfig(n_gpus=2), observer=obs2, tenancy=TenancyConfig())
    assert free["in_use"] == pytest.approx(1.0)


def test_capped_speeds__leaves_runs_without_in_use_quotas_alone() -> None:
    speeds = {"j": {"1g.5gb": 1.0, "3g.20gb": 3.0, "7g.40gb": 7.0}}
    assert capped_speeds(ClusterState(None), "g0", speeds) is speeds
    assert capped_speeds(ClusterState(TenancyConfig()), "g0", speeds) is speeds


@pytest.mark.slow
def test_live__quota_max_in_use_half_then_one_job_on_an_idle_cluster() -> None:
    """The issue's check in process: ``PUT /quotas/U {"max_in_use": 0.5}``, one job of U on
    an idle emulated cluster of 2 GPUs: ``in_use`` of U in the status ``owners`` <= 0.5 at
    every sample while it runs, and it finishes."""
    from fastapi.testclient import TestClient

    from miso.agent import Agent
    from miso.api import UserStore, create_app
    from miso.backend.emulated import EmulatedBackend
    from miso.controller import Controller, ControllerConfig
    from miso.controller.storefile import open_store
    from miso.transport.inprocess import LocalTransport

    d = Path(tempfile.mkdtemp(prefix="miso-cap-"))  # under /tmp: jobs' accounts reach it
    unix = "nobody" if os.geteuid() == 0 else None
    transport = LocalTransport()
    transport.add(Agent("node0", EmulatedBackend(2, node="node0"), d / "agents" / "node0"))
    ctl = Controller(open_store(d), transport,
                     ControllerConfig(**FAST, tenancy=TenancyConfig()),  # type: ignore[arg-type]
                     checkpoint_root=d / "checkpoints")
    ctl.start()
    users = UserStore(d / "users.db")
    admin, u = users.add("admin", admin=True), users.add("u", unix_user=unix)
    seen: list[float] = []
    stop = threading.Event()
    try:
        with TestClient(create_app(ctl, users, snapshot_ttl=0.0)) as client:
            r = client.put("/api/v1/quotas/u", json={"max_in_use": 0.5},
                           headers={"Authorization": f"Bearer {admin}"})
            assert r.status_code == 200, r.text
            r = client.post("/api/v1/jobs", json=_emu_job(2.0),
                            headers={"Authorization": f"Bearer {u}"})
            assert r.status_code == 201, r.text
            job = r.json()["id"]

            def sample() -> None:
                while not stop.is_set():
                    for row in ctl.status().get("owners", {}).values():
                        if row.get("name") == "u":
                            seen.append(float(row["in_use"]))
                    stop.wait(0.02)

            t = threading.Thread(target=sample, daemon=True)
            t.start()
            wait_for(lambda: ctl.store.get(job).state in ("finished", "failed"), 30)
            stop.set()
            t.join(5)
            assert ctl.store.get(job).state == "finished", ctl.store.get(job).reason
    finally:
        stop.set()
        ctl.stop(stop_jobs=True)
        ctl.store.close()
        transport.agents()["node0"].shutdown()
        shutil.rmtree(d, ignore_errors=True)
    assert seen and max(seen) > 0, seen
    assert max(seen) <= 0.5 + 1e-9, max(seen)


def test_sim__nopart_gives_whole_gpus_only_so_the_cap_counts_whole_gpus() -> None:
    """Under ``nopart`` every slice is a whole GPU: admission counts a job as 1.0, so an
    owner capped at 1.5 runs one job at a time on an idle cluster of 2 GPUs (before: both,
    2.0, since admission counted 1.0 + the smallest MIG slice, which nopart never gives)."""
    peak, obs = _peak_held("U")
    jobs = [TraceJob(f"u{i}", 0.0, 600.0, "resnet_train64", "U") for i in range(2)]
    r = run_policy("nopart", jobs, WorldConfig(n_gpus=2), observer=obs,
                   tenancy=TenancyConfig(max_in_use={"U": 1.5}))
    assert all(f > 0 for f in r.finish)
    assert peak["in_use"] == pytest.approx(1.0), peak
    free, obs2 = _peak_held("U")
    run_policy("nopart", jobs, WorldConfig(n_gpus=2), observer=obs2, tenancy=TenancyConfig())
    assert free["in_use"] == pytest.approx(2.0)


def test_nopart__an_owner_capped_below_a_gpu_waits_and_is_told_why() -> None:
    """Capped at 0.5 under ``nopart`` the owner's job is not placed (a whole GPU is 1.0)
    and its wait names the quota; another owner's job runs."""
    from miso.sched import GpuAdded, JobSpec, JobSubmitted
    from miso.sched.driver import DriverStep
    from miso.sched.policies import make_policy

    st = ClusterState(TenancyConfig(max_in_use={"U": 0.5}))
    pol = make_policy("nopart")
    out: list[Any] = []
    step = DriverStep(st, pol, execute=lambda now, d, ctx: out.append(d))
    step(0.0, GpuAdded("g0", "A100-40GB"))
    step(0.0, GpuAdded("g1", "A100-40GB"))
    step(1.0, JobSubmitted(JobSpec("u1", "u1", 4.0, "resnet_train64", owner="U")))
    step(2.0, JobSubmitted(JobSpec("v1", "v1", 4.0, "resnet_train64", owner="V")))
    assert st.jobs["u1"].gpu is None and st.jobs["v1"].gpu is not None, out
    assert st.tenancy is not None
    why = st.tenancy.why_waiting("u1")
    assert why is not None and "needs at least 1.00" in why, why
