"""Live gangs on an in-process emulated cluster (two agents): every rank started together or
none, each with torch.distributed's variables; cancel ends every rank; a lost node ends and
requeues the whole gang (:mod:`miso.controller.gangs`)."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import FAST

from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig
from miso.controller.gangs import check_gang_request
from miso.controller.runtime import SubmitError
from miso.transport.base import NodeUnavailable

#: A rank: checks its variables, writes them to $OUT/rank-<RANK>-<attempt>.json, then runs
#: until $OUT/release exists (or ``HOLD_S`` seconds) and exits 0.
RANK_JOB = textwrap.dedent("""\
    import json, os, sys, time
    e = os.environ
    out = e["OUT"]
    r, w, lr = int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["LOCAL_RANK"])
    assert 0 <= r < w and 0 <= lr <= r and e["MASTER_ADDR"] == "127.0.0.1"
    assert 1024 <= int(e["MASTER_PORT"]) < 65536
    d = {k: e[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                           "MISO_NODE", "MISO_ATTEMPT")}
    path = os.path.join(out, f"rank-{r}-{e['MISO_ATTEMPT']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(d, f)
    os.replace(path + ".tmp", path)  # the test polls for this file: never show it half written
    t = time.time() + float(e.get("HOLD_S", "30"))
    while time.time() < t and not os.path.exists(os.path.join(out, "release")):
        time.sleep(0.05)
""")


def _cluster(tmp: Path, **cfg: float) -> LocalCluster:
    return LocalCluster(tmp / "state", nodes=2, gpus_per_node=1,
                        config=ControllerConfig(policy="miso", **{**FAST, **cfg}))


def _submit(c: LocalCluster, tmp: Path, n: int = 2, **env: str) -> tuple[str, Path]:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    script = tmp / "rank.py"
    script.write_text(RANK_JOB)
    jid = c.submit([sys.executable, str(script)], env={"OUT": str(out), **env}, num_gpus=n)
    return jid, out


def _until(pred, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _ranks(out: Path) -> list[dict[str, str]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


def _running(c: LocalCluster) -> int:
    return sum(len(a.running_pids()) for a in c.transport.agents().values())


def test_gang_request_checked() -> None:
    check_gang_request(2, None, 2)
    check_gang_request(4, 2, 8)
    for n, k, have in ((3, None, 2), (0, None, 2), (4, 3, 8), (True, None, 2)):
        with pytest.raises(SubmitError):
            check_gang_request(n, k, have)


def test_all_or_nothing_launch_then_every_rank_runs(tmp_path: Path) -> None:
    """Rank 1's first launch fails: rank 0 is killed, the gang goes back to the queue and starts
    again whole on fresh attempts; both ranks see a consistent world."""
    with _cluster(tmp_path) as c:
        failed = []

        def hook(node: str, method: str) -> None:
            if method == "launch" and node == "node1" and not failed:
                failed.append(node)
                raise NodeUnavailable("injected")

        c.transport.hook = hook
        assert c.controller is not None
        jid, out = _submit(c, tmp_path)
        assert _until(lambda: len({r["RANK"] for r in _ranks(out)
                                   if int(r["MISO_ATTEMPT"]) > 1}) == 2)
        ranks = [r for r in _ranks(out) if int(r["MISO_ATTEMPT"]) > 1]
        assert {r["MISO_NODE"] for r in ranks} == {"node0", "node1"}
        assert len({r["MASTER_PORT"] for r in ranks}) == 1
        assert {r["WORLD_SIZE"] for r in ranks} == {"2"}
        assert {r["LOCAL_RANK"] for r in ranks} == {"0"}  # one rank per node
        assert failed
        (out / "release").touch()
        assert _until(lambda: c.controller.store.get(jid).state == "finished")
        assert _until(lambda: _running(c) == 0)
        # every attempt's end reaches the store (the poller records a rank's exit after it)
        assert _until(lambda: all(a["ended_at"] is not None
                                  for a in c.controller.store.attempts(jid)))
        atts = c.controller.store.attempts(jid)
        assert atts[0]["status"] in ("killed", "failed", "checkpointed")


def test_cancel_ends_every_rank(tmp_path: Path) -> None:
    with _cluster(tmp_path) as c:
        assert c.controller is not None
        jid, out = _submit(c, tmp_path)
        assert _until(lambda: len(_ranks(out)) == 2)
        assert _running(c) == 2
        c.controller.cancel(jid)
        assert _until(lambda: _running(c) == 0)
        assert c.controller.store.get(jid).state == "cancelled"


def test_lost_node_requeues_the_whole_gang(tmp_path: Path) -> None:
    with _cluster(tmp_path, lease_s=1.0, poll_timeout=0.5, node_failures_to_lose=1) as c:
        ctl = c.controller
        assert ctl is not None
        jid, out = _submit(c, tmp_path)
        assert _until(lambda: len(_ranks(out)) == 2)
        c.transport.remove("node1")
        # node0's rank is ended too; the job waits whole (one GPU left: it cannot start)
        assert _until(lambda: _running(c) == 0 and ctl.store.get(jid).state == "queued")
        time.sleep(0.5)
        assert _running(c) == 0
        atts = ctl.store.attempts(jid)
        assert len(atts) == 2 and all(a["ended_at"] is not None for a in atts)
        assert len(_ranks(out)) == 2  # no rank ran again
        assert jid in ctl.loop.state.gangs.queue


def test_submit_keeps_gpus_and_refuses_more_than_the_cluster(tmp_path: Path) -> None:
    from miso.api.models import SubmitRequest

    with _cluster(tmp_path) as c:
        ctl = c.controller
        assert ctl is not None
        assert _until(lambda: len(ctl.rt.gpus) == 2)
        with pytest.raises(SubmitError, match="the cluster has 2"):
            ctl.submit([sys.executable, "-c", "pass"], num_gpus=3)
        with pytest.raises(SubmitError, match="--nodes"):
            ctl.submit([sys.executable, "-c", "pass"], num_gpus=2, nodes=3)
        jid = ctl.submit([sys.executable, "-c", "pass"], num_gpus=2, nodes=2)
        rec = ctl.store.get(jid)
        assert (rec.num_gpus, rec.nodes) == (2, 2)
        one = ctl.store.get(ctl.submit([sys.executable, "-c", "pass"]))
        assert one.num_gpus is None
    assert SubmitRequest(command=["x"]).num_gpus == 1
    with pytest.raises(ValueError):
        SubmitRequest(command=["x"], num_gpus=0)


#: A rank using the job helper: rank 0 reports and saves; every rank exits 75 when asked.
CKPT_JOB = textwrap.dedent("""\
    import os, time
    from miso import job
    ctx = job.context()
    st = ctx.load() or {"iteration": 0}
    for it in range(st["iteration"], 400):
        time.sleep(0.02)
        ctx.report(it + 1, 400)
        if ctx.checkpoint_requested():
            ctx.save_json({"iteration": it + 1}, iteration=it + 1)
            ctx.exit_checkpointed()
    ctx.finish()
""")


def test_stop_gang_checkpoints_every_rank_then_resumes(tmp_path: Path) -> None:
    """A StopGang (here from a test policy) asks every rank to save and exit: all exit
    checkpointed (a rank >= 1 writes no progress, yet is not taken for a job without the
    helper), and the gang starts again whole from rank 0's checkpoint."""
    from test_gangs_torch import STOP, StopOnTick

    from miso.controller.controller import Controller, make_controller_policy
    from miso.controller.storefile import open_store

    cfg = ControllerConfig(policy="miso", **FAST)
    c = LocalCluster(tmp_path / "state", nodes=2, gpus_per_node=1, config=cfg, start=False)
    for agent in c.transport.agents().values():
        agent.no_helper_after = 0.0  # a silent attempt asked to checkpoint is killed at once
    ctl = Controller(open_store(c.dir), c.transport, cfg, checkpoint_root=c.dir / "checkpoints",
                     policy=StopOnTick(make_controller_policy(cfg)))
    ctl.start()
    c.controller = ctl
    try:
        script = tmp_path / "ck.py"
        script.write_text(CKPT_JOB)
        jid = ctl.submit([sys.executable, str(script)], num_gpus=2)
        assert _until(lambda: (ctl.store.get(jid).iteration or 0) >= 5)
        ctl.rt.queue.put(("tick", STOP))
        assert _until(lambda: len(ctl.store.attempts(jid)) == 4)
        atts = ctl.store.attempts(jid)
        assert [a["status"] for a in atts[:2]] == ["checkpointed", "checkpointed"]
        assert (atts[2]["resume_iteration"] or 0) >= 5
        ctl.cancel(jid)
        assert _until(lambda: _running(c) == 0)
    finally:
        c.close()


#: A one-GPU job (the job helper): marks $OUT/<NAME>-<attempt>.start, runs until
#: $OUT/<NAME>.release exists (or 30 s); saves and exits checkpointed when asked.
ONE_JOB = textwrap.dedent("""\
    import os, time
    from miso import job
    e = os.environ
    out, name = e["OUT"], e["NAME"]
    ctx = job.context()
    open(os.path.join(out, f"{name}-{e['MISO_ATTEMPT']}.start"), "w").close()
    t = time.time() + 30
    while time.time() < t and not os.path.exists(os.path.join(out, f"{name}.release")):
        time.sleep(0.05)
        if ctx.checkpoint_requested():
            ctx.save_json({"iteration": 1}, iteration=1)
            ctx.exit_checkpointed()
    ctx.finish()
""")


@pytest.mark.slow
def test_one_gpu_jobs_backfill_while_a_4_gpu_job_waits(tmp_path: Path) -> None:
    """4 GPUs on two nodes: ``a`` holds one; a 4-GPU gang waits for it with the other three
    reserved; ``b``, submitted after the gang, backfills a reserved GPU (its work is unknown:
    it may run until the reservation starts). When ``a`` ends, ``b`` is checkpointed and the
    gang starts on all four GPUs; ``b`` runs again once the gang has ended."""
    with LocalCluster(tmp_path / "state", nodes=2, gpus_per_node=2,
                      config=ControllerConfig(policy="miso", **FAST)) as c:
        ctl = c.controller
        assert ctl is not None
        assert _until(lambda: len(ctl.rt.gpus) == 4)
        out = tmp_path / "out"
        out.mkdir()
        one = tmp_path / "one.py"
        one.write_text(ONE_JOB)
        a = ctl.submit([sys.executable, str(one)], env={"OUT": str(out), "NAME": "a"})
        assert _until(lambda: any(out.glob("a-*.start")))
        g, _ = _submit(c, tmp_path, n=4)
        b = ctl.submit([sys.executable, str(one)], env={"OUT": str(out), "NAME": "b"})
        assert _until(lambda: any(out.glob("b-*.start")))  # backfilled while the gang waits
        assert ctl.store.get(g).state == "queued" and ctl.store.get(a).state == "running"
        (out / "a.release").touch()
        assert _until(lambda: len({r["RANK"] for r in _ranks(out)}) == 4)
        assert ctl.store.get(b).state == "queued"  # checkpointed for the reservation
        assert ctl.store.attempts(b)[0]["status"] == "checkpointed"
        (out / "release").touch()
        assert _until(lambda: ctl.store.get(g).state == "finished")
        (out / "b.release").touch()
        assert _until(lambda: ctl.store.get(b).state == "finished")
        assert len(list(out.glob("b-*.start"))) == 2
        assert _until(lambda: _running(c) == 0)


def test_rendezvous_at_rank_0s_node_address(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """Each agent advertises MISO_NODE_ADDR (checked: an address or host name); a gang's
    MASTER_ADDR is rank 0's node's address (loopback when none: one host)."""
    from miso.agent.nodeaddr import node_addr, valid_addr
    from miso.controller.gangs import rank_env

    assert valid_addr("10.0.0.7") == "10.0.0.7" and valid_addr("gpu-a.example.org")
    for bad in ("", "a b", "-x", "1.2.3.4; rm -rf /", "$(id)", 7):
        assert valid_addr(bad) is None
    monkeypatch.setenv("MISO_NODE_ADDR", "bad host")
    assert node_addr() is None
    assert rank_env(1, 0, 2, 29500, "10.0.0.7")["MASTER_ADDR"] == "10.0.0.7"
    monkeypatch.setenv("MISO_NODE_ADDR", "127.0.0.1")
    with _cluster(tmp_path) as c:
        ctl = c.controller
        assert ctl is not None
        assert _until(lambda: ctl.rt.node_addrs == {"node0": "127.0.0.1", "node1": "127.0.0.1"})
        # MASTER_PORT: asked of rank 0's node's agent (two distinct ports, one per agent)
        ports: dict[str, int] = {}
        for node, agent in c.transport.agents().items():
            p = agent.free_port()
            while p in ports.values():
                p = agent.free_port()
            ports[node] = p
            monkeypatch.setattr(agent, "free_port", lambda p=p: p)
        jid, out = _submit(c, tmp_path)
        assert _until(lambda: len(_ranks(out)) == 2)
        assert {r["MASTER_ADDR"] for r in _ranks(out)} == {"127.0.0.1"}
        rank0 = next(r for r in _ranks(out) if r["RANK"] == "0")
        assert {int(r["MASTER_PORT"]) for r in _ranks(out)} == {ports[rank0["MISO_NODE"]]}
        (out / "release").touch()
        assert _until(lambda: ctl.store.get(jid).state == "finished")
