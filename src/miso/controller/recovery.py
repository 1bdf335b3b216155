"""Recovery at controller start: make the agents' state match the store before scheduling.

Every agent is asked what still runs. Jobs that finished while no controller watched are
recorded as finished; unfinished jobs are asked to checkpoint (then killed after
``checkpoint_timeout``); attempts of jobs the store does not know are killed; every GPU is
cleared. Attempts no agent reports (their node crashed, or the whole cluster restarted) are
closed: as finished when their guard's exit record says the job exited 0, else as lost - after
waiting out the last lease a controller of this store granted, so that none of them can still
run. Unfinished jobs go back to ``queued``: the controller re-submits them to a fresh
scheduling state and they resume from their last checkpoints (the store's, or the helper's own
record of its last save when the store missed it).
"""

from __future__ import annotations

import logging
import time

from miso.attemptstatus import AttemptStatus
from miso.controller.runtime import Runtime
from miso.job import read_json
from miso.jobstatus import JobStatus
from miso.nodeerrors import NodeUnavailable
from miso.nodewire import exit_record_path

log = logging.getLogger(__name__)


def recover(rt: Runtime) -> None:
    """Bring every reachable agent and the store into agreement (see the module docstring)."""
    active = {r.id: r for r in rt.store.jobs(active_only=True)}
    now = rt.now()
    reached = set()
    for node in rt.transport.nodes():
        try:
            _recover_node(rt, node, set(active), now)
            reached.add(node)
        except NodeUnavailable as e:
            log.warning("recovery: %s", e)
    _close_orphans(rt, now, reached)
    for r in rt.store.jobs(active_only=True):
        rt.store.update(r.id, state=JobStatus.QUEUED, gpu=None, placement=None, mps_pct=None)
    if active:
        rt.store.log_event(now, "recovered", {"active": sorted(active)})


def _close_orphans(rt: Runtime, now: float, reached: set[str]) -> None:
    """Close the attempts no agent accounted for (see the module docstring). An attempt of a
    node whose agent answered and does not know it does not run; others may, until the last
    lease ends."""
    orphans = rt.store.open_attempts()
    if not orphans:
        return
    wait = rt.store.lease_horizon - time.time()  # wall time: leases are read by agents
    if wait > 0 and any(a["node"] not in reached for a in orphans):
        log.warning("recovery: %d attempts on unreachable nodes; waiting %.1fs for their "
                    "lease to end", len(orphans), wait)
        time.sleep(wait)
    for a in orphans:
        rec = read_json(exit_record_path(rt.agent_dir(a["node"]), a["job"], a["attempt"]))
        done = isinstance(rec, dict) and rec.get("returncode") == 0
        end = AttemptStatus.FINISHED if done else AttemptStatus.LOST
        rt.store.end_attempt(a["job"], a["attempt"], status=end,
                             at=now, end_iteration=None, checkpoint_iteration=None,
                             start_iteration=None)
        if done and rt.store.finish(a["job"], JobStatus.FINISHED, at=now):
            rt.store.log_event(now, "recovered-finish", {"job": a["job"]})


def _recover_node(rt: Runtime, node: str, active: set[str], now: float) -> None:
    rep = rt.report(node)
    for a in rep["jobs"]:
        if a["status"] == AttemptStatus.RUNNING:
            if a["job"] in active:
                rt.call(node, "checkpoint", a["job"], a["attempt"])
            else:
                rt.call(node, "kill", a["job"], a["attempt"])
    deadline = time.monotonic() + rt.cfg.checkpoint_timeout
    while time.monotonic() < deadline:
        rep = rt.report(node)
        if all(a["status"] != AttemptStatus.RUNNING for a in rep["jobs"]):
            break
        time.sleep(rt.cfg.poll_interval)
    for a in rep["jobs"]:
        if a["status"] == AttemptStatus.RUNNING:
            rt.call(node, "kill", a["job"], a["attempt"])
    rep = rt.report(node)
    for a in rep["jobs"]:
        rt.record_end(a, now)
        if a["status"] == AttemptStatus.FINISHED and a["job"] in active:
            rt.store.finish(a["job"], JobStatus.FINISHED, at=now)
            rt.store.log_event(now, "recovered-finish", {"job": a["job"]})
        rt.call(node, "forget", a["job"], a["attempt"])
    for g in rt.call(node, "describe")["gpus"]:
        if g["layout"]:
            rt.call(node, "apply_layout", g["index"], [])
