"""A 2-GPU job on two emulated nodes running real torch.distributed (gloo, CPU): stopped and
restarted together by the gang layer (a StopGang, as a reservation or repartition does) and
resumed from rank 0's checkpoint with weights identical to an uninterrupted run."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import FAST

from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig
from miso.controller.controller import Controller, make_controller_policy
from miso.controller.storefile import open_store
from miso.sched import Decision, Event, Tick, WakeUp
from miso.sched.decisions import StopGang
from miso.sched.gangs import GANG_TAG, GangLayer
from miso.sched.state import ClusterState

pytest.importorskip("torch")

TRAIN = textwrap.dedent("""\
    import json, os, time
    import torch
    import torch.distributed as dist
    from miso import job

    ctx = job.context()
    dist.init_process_group("gloo")
    r = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).double()
    st = ctx.load()
    start = 0
    if st:
        start = st["iteration"]
        model.load_state_dict({k: torch.tensor(v, dtype=torch.float64)
                               for k, v in st["weights"].items()})
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    total = int(os.environ["STEPS"])
    ctx.started(start, total)
    for it in range(start, total):
        g = torch.Generator().manual_seed(1000 * it + r)
        x = torch.randn(16, 8, generator=g, dtype=torch.float64)
        y = x.sum(1, keepdim=True)
        opt.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        opt.step()
        ctx.report(it + 1, total)
        flag = torch.tensor([int(ctx.checkpoint_requested())])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            ctx.save_json({"iteration": it + 1, "weights": {
                k: v.tolist() for k, v in model.state_dict().items()}}, iteration=it + 1)
            dist.barrier()
            dist.destroy_process_group()
            ctx.exit_checkpointed()
        time.sleep(float(os.environ["STEP_S"]))
    if r == 0:
        with open(os.environ["FINAL"], "w") as f:
            json.dump({k: v.tolist() for k, v in model.state_dict().items()}, f)
    dist.barrier()
    dist.destroy_process_group()
    ctx.finish()
""")

STOP = "test:stop"


class StopOnTick(GangLayer):
    """The gang layer, plus: a ``test:stop`` tick checkpoints every running gang together
    and wakes the layer up, which starts it again on its held GPUs."""

    def decide(self, now: float, event: Event, state: ClusterState) -> list[Decision]:
        if isinstance(event, Tick) and event.tag == STOP:
            return [*(StopGang(j, "test repartition") for j in sorted(state.gangs.runs)),
                    WakeUp(now + 0.2, f"{GANG_TAG}none")]
        return super().decide(now, event, state)


def _until(pred: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_torch_gang_checkpointed_and_resumed_identically(tmp_path: Path) -> None:
    cfg = ControllerConfig(policy="miso", **{**FAST, "checkpoint_timeout": 20.0})
    c = LocalCluster(tmp_path / "state", nodes=2, gpus_per_node=1, config=cfg, start=False)
    ctl = Controller(open_store(c.dir), c.transport, cfg, checkpoint_root=c.dir / "checkpoints",
                     policy=StopOnTick(make_controller_policy(cfg)))
    ctl.start()
    c.controller = ctl
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {"STEPS": "60", "STEP_S": "0.05", "GLOO_SOCKET_IFNAME": "lo"}
    try:
        stopped = ctl.submit([sys.executable, str(script)], num_gpus=2, nodes=2, name="stopped",
                             env={**env, "FINAL": str(tmp_path / "stopped.json")})
        assert _until(lambda: (ctl.store.get(stopped).iteration or 0) >= 10, 120)
        ctl.rt.queue.put(("tick", STOP))
        assert _until(lambda: ctl.store.get(stopped).state == "finished", 180), \
            ctl.store.get(stopped)
        atts = ctl.store.attempts(stopped)
        assert len(atts) == 4, atts      # 2 ranks, started twice, none run again
        assert [a["status"] for a in atts[:2]] == ["checkpointed", "checkpointed"]
        assert atts[2]["resume_iteration"] and atts[2]["resume_iteration"] >= 10
        whole = ctl.submit([sys.executable, str(script)], num_gpus=2, nodes=2, name="whole",
                           env={**env, "STEP_S": "0", "FINAL": str(tmp_path / "whole.json")})
        assert _until(lambda: ctl.store.get(whole).state == "finished", 180), \
            ctl.store.get(whole)
        assert len(ctl.store.attempts(whole)) == 2
        a = json.loads((tmp_path / "stopped.json").read_text())
        b = json.loads((tmp_path / "whole.json").read_text())
        assert a == b  # bit for bit
    finally:
        c.close()
