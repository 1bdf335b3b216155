"""Agent poller: finds agents, asks each for its report every ``poll_interval`` seconds.

One thread (``miso-poll``) hands each node's poll, when due, to a small pool of
:data:`POLL_WORKERS` threads, so a hung node (up to ``poll_timeout``) delays nobody else's
lease, and a thousand GPUs' nodes cost a few threads, not one each. Every poll renews the
node's lease (:meth:`Runtime.report`). The running jobs' progress of every report is kept in
memory and written to the store in one transaction per pass (:meth:`AgentPoller.flush_progress`;
an exit writes its job's first: one store writer per node, each holding the store while the
loop waited, was what a head of 128 nodes spent its time on). Reports become events for
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from miso.agent.nodeaddr import valid_addr
from miso.attemptstatus import AttemptStatus
from miso.controller.executor import PlanExecutor
from miso.controller.launcher import Relaunch
from miso.controller.runtime import GpuRef, Run, Runtime
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

#: Threads polling nodes at once (a hung node holds one for up to ``poll_timeout``).
POLL_WORKERS = 16


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
        self._pool: ThreadPoolExecutor | None = None
        #: nodes whose poll is queued or running, and when each node's next poll is due
        #: (monotonic), under ``_flight`` (notified when a poll ends)
        self._in_flight: set[str] = set()
        self._due: dict[str, float] = {}
        self._flight = threading.Condition()
        #: running jobs' progress not yet in the store (job -> fields, the latest values)
        self._pending: dict[str, dict[str, Any]] = {}
        self._pending_lock = threading.Lock()
        #: orders the store writes of progress: a pass's batch, an exit's last progress
        self._write_lock = threading.Lock()

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=POLL_WORKERS,
                                        thread_name_prefix="miso-poll-node")
        self._thread = threading.Thread(target=self._loop, name="miso-poll", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) for the poll thread and the polls in flight to end."""
        deadline = time.monotonic() + timeout
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        with self._flight:
            while self._in_flight and time.monotonic() < deadline:
                self._flight.wait(max(0.0, deadline - time.monotonic()))

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
                self._poll_due()
            except Exception as e:  # noqa: BLE001
                log.exception("discovery failed")
                rt.error(f"discovery: {e}")
            try:
                self.flush_progress()
            except Exception as e:  # noqa: BLE001 - e.g. disk full: kept, the next pass retries
                log.exception("writing jobs' progress failed")
                rt.error(f"progress: {type(e).__name__}: {e}")
            rt.stopping.wait(min(rt.cfg.discover_interval, 1.0,
                                 max(0.02, rt.cfg.poll_interval / 4)))
        self.flush_progress()

    def _poll_due(self) -> None:
        """Hand the nodes whose poll is due (and not still running) to the pool. A node seen
        for the first time is due within one ``poll_interval``, spread over it, so nodes that
        join together are not polled in one burst ever after."""
        rt = self.rt
        if self._pool is None:
            return
        with rt.lock:
            nodes = sorted(rt.nodes)
        now = time.monotonic()
        due: list[str] = []
        with self._flight:
            new = [n for n in nodes if n not in self._due]
            for k, n in enumerate(new):
                self._due[n] = now + rt.cfg.poll_interval * k / len(new)
            for n in [n for n in self._due if n not in rt.nodes and n not in self._in_flight]:
                del self._due[n]  # lost: due at once when it joins again
            for n in nodes:
                if n not in self._in_flight and self._due[n] <= now:
                    self._in_flight.add(n)
                    self._due[n] = max(self._due[n] + rt.cfg.poll_interval, now)
                    due.append(n)
        for n in due:
            self._pool.submit(self._poll_task, n)

    def _poll_task(self, node: str) -> None:
        rt = self.rt
        try:
            with rt.lock:
                known = node in rt.nodes
            if known and not rt.stopping.is_set():
                self._poll(node)
        except Exception as e:  # noqa: BLE001 - e.g. a store write failed: next poll retries
            log.exception("poll %s failed", node)
            rt.error(f"poll {node}: {type(e).__name__}: {e}")
        finally:
            with self._flight:
                self._in_flight.discard(node)
                self._flight.notify_all()

    def flush_progress(self) -> None:
        """Write the running jobs' progress kept since the last time, in one transaction
        (on failure it is kept, under any newer values, for the next time)."""
        with self._write_lock:
            with self._pending_lock:
                rows, self._pending = self._pending, {}
            if not rows:
                return
            try:
                self.rt.store.progress_many(list(rows.items()))
            except BaseException:
                with self._pending_lock:
                    for job, fields in rows.items():
                        self._pending[job] = {**fields, **self._pending.get(job, {})}
                raise

    def _keep_progress(self, job: str, prog: dict[str, Any]) -> None:
        with self._pending_lock:
            have = self._pending.get(job)
            self._pending[job] = prog if have is None else {**have, **prog}

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
        """Turn one agent report into store progress (kept for the pass's one write:
        :meth:`flush_progress`) and loop events."""
        rt = self.rt
        now = rt.now()
        jobs = rep["jobs"]
        with rt.lock:  # one look for the whole report
            runs = {a["job"]: rt.runs.get(a["job"]) for a in jobs}
        gangs = self.executor.gangs
        for a in jobs:
            job, attempt = a["job"], a["attempt"]
            if gangs.others and gangs.rank_report(node, a):
                continue  # a gang's rank >= 1 (:mod:`miso.controller.gangs`)
            run = runs[job]
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
            if a.get("iteration") is not None:
                prog.update(iteration=a["iteration"], total=a.get("total"), rate=a.get("rate"))
            if a.get("checkpoint_iteration") is not None:
                prog.update(checkpoint_iteration=a["checkpoint_iteration"],
                            checkpoint_path=a["checkpoint_path"])
            if a["status"] == AttemptStatus.RUNNING:
                if prog:
                    self._keep_progress(job, prog)
            else:
                self._on_exit(node, run, a, now, prog)
                continue
            if not run.stopping and a.get("total") \
                    and a.get("iteration") is not None and (a.get("rate") or 0) > 0:
                rt.post_progress(job, run.gpu, run.placement, run.mps_pct,
                                 float(a["total"]) - float(a["iteration"]), float(a["rate"]))
            if run.mps_pct is None and not run.stopping:
                if a.get("steady_rate") and not run.observed_sent:
                    run.observed_sent = True
                    rt.post_event(SpeedObserved(job, run.gpu, run.placement,
                                                float(a["steady_rate"])))
                if a.get("change_seq", 0) > run.change_seq_sent and a.get("change"):
                    run.change_seq_sent = a["change_seq"]
                    obs, base = a["change"]
                    rt.post_event(JobSpeedChanged(job, run.gpu, float(obs), float(base)))

    def _on_exit(self, node: str, run: Run, a: dict[str, Any], now: float,
                 prog: dict[str, Any]) -> None:
        """The attempt ``run`` has ended (``a``: its last report)."""
        rt = self.rt
        job, attempt = run.job, run.attempt
        # store first: if a write fails, the next poll sees the same exit again; its progress
        # kept for the pass goes first, and no pass writes it after the end
        with self._write_lock:
            with self._pending_lock:
                kept = self._pending.pop(job, None)
            last = {**(kept or {}), **prog}
            if last:
                try:
                    rt.store.progress(job, **last)
                except BaseException:
                    if kept is not None:
                        self._keep_progress(job, kept)
                    raise
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
