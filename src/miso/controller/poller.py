"""Agent poller: finds agents, asks each for its report every ``poll_interval`` seconds.

Each node is polled by its own thread, so a hung node delays nobody else's lease. Every poll
renews the node's lease (:meth:`Runtime.report`). Reports become store progress and events for
the loop: process exits (``JobFinished`` / ``JobFailed``), steady rates (``SpeedObserved``) and
speed changes (``JobSpeedChanged``). A job its guard fenced (the lease ran out while the node
was still ours, e.g. a slow controller restart) is restarted in place from its checkpoint. A new
agent's GPUs are cleared and announced (``GpuAdded``); an agent that stops answering is handed to
the loop as a lost node, which the loop handles once the node's lease has run out.

An agent that comes back by itself (Ray restarts a killed agent actor) is a new incarnation
(``incarnation`` in its ``describe`` and ``report``): its guards died with the old agent, so the
node is lost all the same - fenced, its jobs requeued once the lease has run out - and then
joins again as new. Until it does, ``Runtime.lost`` says since when and why; once it has, its
entry says since when it is back (``status`` shows it for ``statustext.RECENT_LOSS_S``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from miso.agent.nodeaddr import valid_addr
from miso.attemptstatus import AttemptStatus
from miso.controller.executor import PlanExecutor
from miso.controller.launcher import Relaunch
from miso.controller.runtime import GpuRef, Runtime
from miso.controller.statustext import prune_losses
from miso.jobstatus import LIMIT_REASON, JobStatus
from miso.mig import geometry
from miso.nodeerrors import NodeUnavailable
from miso.sched import (
    GpuAdded,
    JobCheckpointable,
    JobFailed,
    JobFinished,
    JobSpeedChanged,
    SpeedObserved,
)

log = logging.getLogger(__name__)

#: Start of a running job's note when its progress file is bad (see :meth:`on_report`).
REPORTS_INVALID = "reports invalid"
#: Seconds between two store writes of a node's running jobs' iteration and rate (what
#: ``miso status`` shows); a new checkpoint, a job's first report and its end are written at
#: once. Writing every job at every poll was most of the pollers' store traffic at size.
PROGRESS_STORE_S = 5.0
#: A running job's progress goes to the loop again when the remaining iterations it reports
#: are more than this many seconds of the job (at the rate last sent) away from what the
#: last report sent predicts (the loop's estimate shrinks at that rate between reports)...
PROGRESS_DRIFT_S = 1.0
#: ... or when this many seconds have passed since the last one sent.
PROGRESS_REFRESH_S = 10.0


def progress_moved(posted: tuple[float, float, float] | None, left: float, rate: float,
                   mono: float) -> bool:
    """Whether a running job's report of ``left`` iterations at ``rate`` iterations/s at
    monotonic time ``mono`` is news for the loop, given the last one sent, ``posted``
    ``(time, left, rate)``: the loop extrapolates remaining work at the slice's rate, so a
    job running at the rate it last reported need not be re-sent at every poll."""
    if posted is None:
        return True
    t0, left0, rate0 = posted
    if mono - t0 >= PROGRESS_REFRESH_S or rate0 <= 0:
        return True
    return abs(left0 - rate0 * (mono - t0) - left) > PROGRESS_DRIFT_S * rate0



class AgentPoller:
    """Discovery and polling of agents (see the module docstring)."""

    def __init__(self, rt: Runtime, executor: PlanExecutor) -> None:
        self.rt = rt
        self.executor = executor
        self._node_fail: dict[str, int] = {}
        #: The agent incarnation each node answered with first (None: not told).
        self._incarnation: dict[str, str | None] = {}
        self._last_discover = 0.0
        self._thread: threading.Thread | None = None
        self._node_threads: dict[str, threading.Thread] = {}
        #: When each node's running jobs' iteration and rate are next written to the store
        #: (monotonic; each written by that node's thread only).
        self._store_due: dict[str, float] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="miso-poll", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        for t in [self._thread, *self._node_threads.values()]:
            if t is not None:
                t.join(timeout=timeout)

    # ---- discovery ----------------------------------------------------------------------

    def discover(self, force: bool = False) -> None:
        """Add agents not known yet: clear their GPUs, announce them to the loop."""
        rt = self.rt
        if not force and time.monotonic() - self._last_discover < rt.cfg.discover_interval:
            return
        self._last_discover = time.monotonic()
        try:
            nodes = rt.transport.nodes()
        except Exception as e:  # noqa: BLE001 - a flaky listing must not kill the poller
            log.warning("listing nodes: %s", e)
            return
        for node in nodes:
            if node not in rt.nodes and node not in rt.fencing:
                self._add_node(node)

    def _add_node(self, node: str) -> None:
        rt = self.rt
        try:
            desc = rt.call(node, "describe")
            for g in desc["gpus"]:
                if g["layout"]:
                    res = rt.call(node, "apply_layout", g["index"], [])
                    if not res["ok"]:
                        log.warning("node %s GPU %s not cleared: %s", node, g["index"],
                                    res["error"])
        except NodeUnavailable as e:
            log.warning("new node %s: %s", node, e)
            return
        with rt.lock:
            rt.nodes.add(node)
            if node in rt.lost:  # back: status keeps saying it was lost for a while
                rt.lost[node]["back"] = time.time()
            self._incarnation[node] = desc.get("incarnation")
            if desc.get("workdir"):
                rt.agent_dirs[node] = str(desc["workdir"])
            addr = valid_addr(desc.get("addr"))  # a gang's MASTER_ADDR when rank 0 is here
            if addr is not None:
                rt.node_addrs[node] = addr
            self._node_fail[node] = 0
        for g in desc["gpus"]:
            if not g.get("mig", True):
                log.warning("node %s GPU %d: MIG is off; not used", node, g["index"])
                continue
            gid = f"{node}/{g['index']}"
            profiles = tuple(g["profiles"]) if g.get("profiles") else None
            geom = geometry(g["model"], profiles, g.get("driver"))
            self.executor.add_gpu(GpuRef(gid, node, g["index"], g["model"], geom))
            rt.post_event(GpuAdded(gid, g["model"], profiles, g.get("driver")))
        rt.store.log_event(rt.now(), "node-joined", {"node": node})

    # ---- polling ------------------------------------------------------------------------

    def _loop(self) -> None:
        rt = self.rt
        while not rt.stopping.is_set():
            try:
                rt.backup_if_due()
                self.discover()
                with rt.lock:
                    nodes = sorted(rt.nodes)
                for node in nodes:
                    t = self._node_threads.get(node)
                    if t is None or not t.is_alive():
                        t = threading.Thread(target=self._node_loop, args=(node,),
                                             name=f"miso-poll-{node}", daemon=True)
                        self._node_threads[node] = t
                        t.start()
            except Exception as e:  # noqa: BLE001
                log.exception("discovery failed")
                rt.error(f"discovery: {e}")
            rt.stopping.wait(min(rt.cfg.discover_interval, 1.0))

    def _node_loop(self, node: str) -> None:
        rt = self.rt
        while not rt.stopping.is_set():
            with rt.lock:
                if node not in rt.nodes:
                    return
            t0 = time.monotonic()
            try:
                if not self._poll(node):
                    return
            except Exception as e:  # noqa: BLE001 - e.g. a store write failed: next poll retries
                log.exception("poll %s failed", node)
                rt.error(f"poll {node}: {type(e).__name__}: {e}")
            rt.stopping.wait(max(0.0, rt.cfg.poll_interval - (time.monotonic() - t0)))

    def _poll(self, node: str) -> bool:
        """Poll ``node`` once; False when it has just been declared lost."""
        rt = self.rt
        try:
            rep = rt.report(node)
        except NodeUnavailable as e:
            n = self._node_fail.get(node, 0) + 1
            self._node_fail[node] = n
            log.warning("poll %s failed (%d): %s", node, n, e)
            if n >= rt.cfg.node_failures_to_lose or node not in rt.transport.nodes():
                self._lose(node, f"its agent stopped answering: {e}")
                return False
            return True
        self._node_fail[node] = 0
        with rt.lock:  # a node back from a loss stays in status for a while, then goes
            prune_losses(rt.lost)
        inc, known = rep.get("incarnation"), self._incarnation.get(node)
        if inc is not None and known is not None and inc != known:
            self._lose(node, "its agent restarted (the previous one died with its jobs' "
                             "guards)")
            return False
        self.on_report(node, rep)
        return True

    def _lose(self, node: str, why: str) -> None:
        """Stop using ``node`` now; the loop requeues its jobs once its lease has run out."""
        rt = self.rt
        with rt.lock:
            if node not in rt.nodes:
                return
            rt.nodes.discard(node)
            rt.fencing.add(node)
            rt.lost[node] = {"since": time.time(), "why": " ".join(why.split())[:300]}
            # wall time: leases are read by the agents' guards (other processes)
            fence_at = rt.leases.get(node, time.time()) + 0.5
            gpus = [g.id for g in rt.gpus.values() if g.node == node]
        for g in gpus:
            self.executor.close_gpu(g)
        log.warning("node %s unreachable: its jobs restart elsewhere after its lease ends "
                    "in %.1fs", node, max(0.0, fence_at - time.time()))
        rt.store.log_event(rt.now(), "node-unreachable", {"node": node, "fence_at": fence_at,
                                                          "why": rt.lost[node]["why"]})
        rt.queue.put(("node_lost", node, fence_at))

    def on_report(self, node: str, rep: dict[str, Any]) -> None:
        """Turn one agent report into store progress and loop events."""
        rt = self.rt
        now = rt.now()
        mono = time.monotonic()
        # the running jobs' iteration and rate go to the store (``miso status``) every
        # PROGRESS_STORE_S per node, not at every poll; a new checkpoint and an end at once
        store_due = mono >= self._store_due.get(node, 0.0)
        if store_due:
            self._store_due[node] = mono + PROGRESS_STORE_S
        progress: list[tuple[str, dict[str, Any]]] = []
        try:
            with rt.progress_batch():  # one loop item for the report's progress reports
                self._on_jobs(node, rep, now, progress, store_due, mono)
        finally:  # one store transaction for the progress of every job of the report
            if progress:
                try:
                    rt.store.progress_many(progress)
                except BaseException:
                    self._store_due[node] = 0.0  # the next poll writes all of it again
                    raise

    def _on_jobs(self, node: str, rep: dict[str, Any], now: float,
                 progress: list[tuple[str, dict[str, Any]]], store_due: bool,
                 mono: float) -> None:
        rt = self.rt
        for a in rep["jobs"]:
            job, attempt = a["job"], a["attempt"]
            if self.executor.gangs.rank_report(node, a):
                continue  # a gang's rank >= 1 (:mod:`miso.controller.gangs`)
            with rt.lock:
                run = rt.runs.get(job)
                current = run is not None and run.attempt == attempt and run.node == node
            if not current:
                if a["status"] == AttemptStatus.RUNNING:
                    rec = rt.job(job)
                    if rec is None or rec.terminal or rec.attempts > attempt:
                        rt.try_call(node, "kill", job, attempt)
                else:
                    rt.try_call(node, "forget", job, attempt)
                continue
            assert run is not None
            self._note_report_error(job, run.last.get("report_error") or "",
                                    a.get("report_error") or "")
            before = run.last
            run.last = a
            if a.get("checkpointable") != before.get("checkpointable"):  # else known already
                self._note_checkpointable(job, a.get("checkpointable"))
            prog: dict[str, Any] = {}
            fresh = not before or a["status"] != AttemptStatus.RUNNING
            if a.get("iteration") is not None and (store_due or fresh):
                prog.update(iteration=a["iteration"], total=a.get("total"), rate=a.get("rate"))
            if a.get("checkpoint_iteration") is not None and (
                    store_due or fresh or prog
                    or a["checkpoint_iteration"] != before.get("checkpoint_iteration")
                    or a.get("checkpoint_path") != before.get("checkpoint_path")):
                prog.update(checkpoint_iteration=a["checkpoint_iteration"],
                            checkpoint_path=a["checkpoint_path"])
            if prog:
                progress.append((job, prog))
            if a["status"] == AttemptStatus.RUNNING and not run.stopping and a.get("total") \
                    and a.get("iteration") is not None and (a.get("rate") or 0) > 0:
                left, rate = float(a["total"]) - float(a["iteration"]), float(a["rate"])
                if progress_moved(run.posted, left, rate, mono):
                    run.posted = (mono, left, rate)
                    rt.post_progress(job, run.gpu, run.placement, run.mps_pct, left, rate)
            if a["status"] == AttemptStatus.RUNNING:
                if run.mps_pct is None and not run.stopping:
                    if a.get("steady_rate") and not run.observed_sent:
                        run.observed_sent = True
                        rt.post_event(SpeedObserved(job, run.gpu, run.placement,
                                                    float(a["steady_rate"])))
                    if a.get("change_seq", 0) > run.change_seq_sent and a.get("change"):
                        run.change_seq_sent = a["change_seq"]
                        obs, base = a["change"]
                        rt.post_event(JobSpeedChanged(job, run.gpu, float(obs), float(base)))
                continue
            # store first: if a write fails, the next poll sees the same exit again
            if progress:
                rt.store.progress_many(progress)
                progress.clear()
            rt.record_end(a, now)
            if a["status"] == AttemptStatus.FINISHED:
                # Terminal in the store at once, not when the loop gets to the event: a GPU
                # worker between two MPS profiling levels must not relaunch a finished job.
                rt.store.finish(job, JobStatus.FINISHED, at=now)
                rt.finished_in_store.add(job)
            rt.drop_run(run)
            run.status = a["status"]
            if a["status"] == AttemptStatus.FINISHED:
                rt.post_event(JobFinished(job))
            elif a["status"] == AttemptStatus.FENCED and not run.stopping \
                    and not self.executor.gangs.owns(job):  # a gang's rank 0: it fails
                log.warning("job %s attempt %d was fenced on %s: restarting it in place",
                            job, attempt, node)
                self.executor.submit(run.gpu, Relaunch(job, run.gpu, run.placement,
                                                       run.mps_pct))
            elif a["status"] == "limit":
                rt.post_event(JobFailed(job, f"{LIMIT_REASON}{a.get('limit') or ''}"))
            elif not run.stopping:
                why = f"exit code {a['returncode']}" \
                    if a["status"] != AttemptStatus.CHECKPOINTED else \
                    "exited with the checkpoint code although no checkpoint was asked"
                cause = failure_cause(a.get("log_tail") or "")
                rt.post_event(JobFailed(job, why + (f": {cause}" if cause else "")))
            run.done.set()
            rt.try_call(node, "forget", job, attempt)

    def _note_report_error(self, job: str, before: str, now: str) -> None:
        """Show (in the job's note, hence ``miso status``) that the job's own reports are
        invalid - its progress file is bad - and clear it once they are valid again."""
        if now == before:
            return
        rec = self.rt.job(job)
        if rec is None:
            return
        if now:
            self.rt.store.progress(job, note=f"{REPORTS_INVALID}: {str(now)[:200]}")
            self.rt.store.log_event(self.rt.now(), "reports-invalid",
                                    {"job": job, "error": str(now)[:200]})
        elif rec.note.startswith(REPORTS_INVALID):
            self.rt.store.progress(job, note="")

    def _note_checkpointable(self, job: str, value: bool | None) -> None:
        if value is None:
            return
        rec = self.rt.job(job)
        if rec is not None and rec.checkpointable is not value:
            self.rt.store.progress(job, checkpointable=int(value))
            self.rt.post_event(JobCheckpointable(job, bool(value)))


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault)\b(:.*)?$")


def failure_cause(tail: str) -> str:
    """The line of a failed job's output that says why it failed: the exception line of its
    last Python traceback (``AssertionError: Torch not compiled with CUDA enabled``), else its
    last non-empty line; the whole output stays in ``miso logs``."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _EXCEPTION_LINE.match(ln):
            return ln
    return lines[-1] if lines else ""
