"""Recovery at controller start: make the agents' state match the store before scheduling.

Every agent is asked what still runs. Jobs that finished while no controller watched are
recorded as finished; unfinished jobs are asked to checkpoint (then killed after
``checkpoint_timeout``); attempts of jobs the store does not know are killed; every GPU is
cleared. Unfinished jobs go back to ``queued``: the controller re-submits them to a fresh
scheduling state and they resume from their last checkpoints.
"""

from __future__ import annotations

import logging
import time

from miso.controller.runtime import Runtime
from miso.controller.transport import NodeUnavailable

log = logging.getLogger(__name__)


def recover(rt: Runtime) -> None:
    """Bring every reachable agent and the store into agreement (see the module docstring)."""
    active = {r.id: r for r in rt.store.jobs(active_only=True)}
    now = rt.now()
    for node in rt.transport.nodes():
        try:
            _recover_node(rt, node, set(active), now)
        except NodeUnavailable as e:
            log.warning("recovery: %s", e)
    for r in rt.store.jobs(active_only=True):
        rt.store.update(r.id, state="queued", gpu=None, placement=None, mps_pct=None)
    if active:
        rt.store.log_event(now, "recovered", {"active": sorted(active)})


def _recover_node(rt: Runtime, node: str, active: set[str], now: float) -> None:
    rep = rt.call(node, "report")
    for a in rep["jobs"]:
        if a["status"] == "running":
            if a["job"] in active:
                rt.call(node, "checkpoint", a["job"], a["attempt"])
            else:
                rt.call(node, "kill", a["job"], a["attempt"])
    deadline = time.time() + rt.cfg.checkpoint_timeout
    while time.time() < deadline:
        rep = rt.call(node, "report")
        if all(a["status"] != "running" for a in rep["jobs"]):
            break
        time.sleep(rt.cfg.poll_interval)
    for a in rep["jobs"]:
        if a["status"] == "running":
            rt.call(node, "kill", a["job"], a["attempt"])
    rep = rt.call(node, "report")
    for a in rep["jobs"]:
        rt.record_end(a, now)
        if a["status"] == "finished" and a["job"] in active:
            rt.store.finish(a["job"], "finished", at=now)
            rt.store.log_event(now, "recovered-finish", {"job": a["job"]})
        rt.call(node, "forget", a["job"], a["attempt"])
    for g in rt.call(node, "describe")["gpus"]:
        if g["layout"]:
            rt.call(node, "apply_layout", g["index"], [])
