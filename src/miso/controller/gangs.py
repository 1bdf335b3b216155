"""Live gangs: a job's ranks on several whole GPUs, started, checkpointed and ended together.

The core decides gangs (:mod:`miso.sched.gangs`, :class:`~miso.sched.decisions.StartGang` /
:class:`~miso.sched.decisions.StopGang`); :class:`GangRunner` carries them out through the
agents, one decision at a time on its own thread (a gang spans several GPUs, so no GPU's
worker owns it):

* **Start, all or none**: each GPU gets its one full-size MIG instance (a whole GPU: MIG stays
  on, as the operator set it), then rank ``i`` is launched on ``gpus[i]`` as an attempt of its
  own (attempt numbers are never reused, so no rank runs twice) with ``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR`` (rank 0's node: the address its agent advertises,
  :mod:`miso.agent.nodeaddr`; 127.0.0.1 when none, every agent of an emulated cluster being on
  this host) and ``MASTER_PORT`` (a port free on rank 0's node, asked of its agent per
  start). If one rank cannot start, the
  started ones are killed and the core hears :class:`~miso.sched.events.GangFailed` (the job
  is back in its queue); else :class:`~miso.sched.events.GangStarted`.
* Rank 0's run is the job's run (``Runtime.runs``): its progress, checkpoints and exit are
  handled like any job's. The other ranks are kept here; :meth:`rank_report` takes their
  agents' reports (the poller asks it first).
* **Stop** (checkpoint together): every rank is asked to save and exit (only rank 0 writes,
  :mod:`miso.job`); the late ones are killed.
* **End**: when the job finishes, fails or is cancelled, every rank still running is ended.
* **A lost node** ends every gang with a rank on it: ranks elsewhere are killed, the job goes
  back to the queue whole (the core requeues it on the lost GPU's ``GpuRemoved``).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from typing import Any

from miso.controller.launcher import Launcher, resume_point
from miso.controller.runtime import Run, Runtime, SubmitError
from miso.jobstatus import JobStatus
from miso.mig import Placement
from miso.nodeerrors import NodeUnavailable
from miso.nodewire import layout_data
from miso.sched import Decision, JobFailed
from miso.sched.decisions import StartGang, StopGang
from miso.sched.events import GangFailed, GangStarted

log = logging.getLogger(__name__)

#: The rendezvous host of an emulated cluster (every agent runs on this host).
MASTER_ADDR = "127.0.0.1"
#: Seconds the other ranks get to exit by themselves once rank 0 has finished.
FINISH_GRACE_S = 10.0


def check_gang_request(num_gpus: Any, nodes: Any, cluster_gpus: int) -> None:
    """Refuse (:class:`SubmitError`, one line) a GPU count outside 1..the cluster's GPUs, or a
    node count that does not divide it."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise SubmitError(f"--gpus must be a whole number >= 1, got {num_gpus!r}")
    if num_gpus > 1 and num_gpus > cluster_gpus:
        raise SubmitError(f"job asks for {num_gpus} GPUs; the cluster has {cluster_gpus}")
    if nodes is None:
        return
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= num_gpus \
            or num_gpus % nodes:
        raise SubmitError(f"--nodes must divide --gpus ({num_gpus}) evenly, got {nodes!r}")


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous port of one gang start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((MASTER_ADDR, 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, local_rank: int, world: int, port: int,
             master: str = MASTER_ADDR) -> dict[str, str]:
    """The variables torch.distributed reads, for one rank (``master``: rank 0's node)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "MASTER_ADDR": master, "MASTER_PORT": str(port)}


class GangRunner:
    """Carries out gang decisions (see the module docstring)."""

    def __init__(self, rt: Runtime, launcher: Launcher) -> None:
        self.rt = rt
        self.launcher = launcher
        #: ranks >= 1 still running or ending: (job, attempt) -> (rank, run)
        self.others: dict[tuple[str, int], tuple[int, Run]] = {}
        self._jobs: set[str] = set()  # jobs whose ranks this runner started (ever)
        self._q: queue.Queue[Decision | None] = queue.Queue()
        self._busy = 0
        self._thread = threading.Thread(target=self._work, name="miso-gangs", daemon=True)
        self._thread.start()

    # ---- queries --------------------------------------------------------------------------

    def owns(self, job: str) -> bool:
        """``job`` was run as a gang (or a whole-GPU backfill) by this runner."""
        return job in self._jobs

    def runs(self, job: str) -> list[Run]:
        """Every live rank run of ``job`` (rank 0 first)."""
        with self.rt.lock:
            r0 = self.rt.runs.get(job)
            rest = sorted((k, r) for (j, _), (k, r) in self.others.items() if j == job)
        return ([r0] if r0 is not None else []) + [r for _, r in rest]

    def busy(self) -> bool:
        return bool(self._busy) or not self._q.empty()

    # ---- decisions ------------------------------------------------------------------------

    def submit(self, d: StartGang | StopGang) -> None:
        with self.rt.lock:
            self._busy += 1
        self._q.put(d)

    def close(self) -> None:
        self._q.put(None)

    def _work(self) -> None:
        while True:
            d = self._q.get()
            if d is None:
                return
            try:
                if isinstance(d, StartGang):
                    self.start(d)
                elif isinstance(d, StopGang):
                    self.stop(d.job)
            except Exception as e:  # noqa: BLE001 - report; the GPUs stay held by the core
                log.exception("gang %s: %s failed", getattr(d, "job", "?"), type(d).__name__)
                self.rt.error(f"gang {getattr(d, 'job', '?')}: {type(d).__name__}: {e}")
                if isinstance(d, StartGang):
                    self.rt.post_event(GangFailed(d.job, d.plan_id, f"{type(e).__name__}: {e}"))
            finally:
                with self.rt.lock:
                    self._busy -= 1

    def start(self, d: StartGang) -> None:
        """Launch every rank of ``d.job`` or none (see the module docstring)."""
        rt = self.rt
        job = d.job
        rec = rt.job(job)
        if rec is None or rec.terminal:
            rt.post_event(GangFailed(job, d.plan_id, "the job has ended"))
            return
        if not self._wait_gone(job):
            rt.post_event(GangFailed(job, d.plan_id, "its previous run has not ended"))
            return
        self._jobs.add(job)
        refs = [rt.gpus.get(g) for g in d.gpus]
        missing = [g for g, r in zip(d.gpus, refs, strict=True) if r is None]
        if missing:
            rt.post_event(GangFailed(job, d.plan_id, f"GPU {missing[0]} is gone"))
            return
        now = rt.now()
        ck_dir = rt.checkpoint_root / job
        resume, path = resume_point(rec.checkpoint_iteration, rec.checkpoint_path, ck_dir)
        if path is not None and path != rec.checkpoint_path:
            rt.store.progress(job, checkpoint_iteration=resume, checkpoint_path=path)
        # rank 0's node is the rendezvous host (its advertised address; one host: loopback)
        master = rt.node_addrs.get(refs[0].node, MASTER_ADDR) if refs[0] else MASTER_ADDR
        port = self.rendezvous_port(refs[0].node if refs[0] else None)
        started: list[Run] = []
        per_node: dict[str, int] = {}
        world = len(d.gpus)
        error = ""
        for rank, ref in enumerate(refs):
            assert ref is not None
            full = Placement(0, ref.geom.model.full_profile().name)
            run: Run | None = None
            try:
                res = rt.call(ref.node, "apply_layout", ref.index, layout_data([full]))
                rt.store.record_layout(ref.id, ref.model, res["layout"], plan_id=d.plan_id,
                                       ok=res["ok"], at=rt.now())
                if not res["ok"]:
                    error = f"GPU {ref.id}: {res['error']}"
                    break
                local = per_node.get(ref.node, 0)
                per_node[ref.node] = local + 1
                attempt = rt.store.new_attempt(
                    job, node=ref.node, gpu=ref.id, placement=str(full), mps_pct=None,
                    resume_iteration=resume, at=now, restart=rank == 0 and rec.attempts > 0,
                    at_least=rt.used_attempts(job) + 1)
                spec = {"job": job, "attempt": attempt, "command": rec.command,
                        "gpu": ref.index, "placement": [full.start, full.profile],
                        "mps_pct": None, "checkpoint_dir": str(ck_dir), "resume_from": path,
                        "env": {**rec.env, **rank_env(rank, local, world, port, master)},
                        "cwd": rec.cwd, "owner": rec.owner, "unix_user": rec.unix_user,
                        "rank": rank}
                run = Run(job, attempt, ref.node, ref.id, ref.index, full, None, time.time())
                # the core hears a gang's speed from its progress only (its GPUs are held)
                run.observed_sent = True
                run.change_seq_sent = 1 << 62
                with rt.lock:
                    if rank == 0:
                        rt.runs[job] = run
                    else:
                        self.others[(job, attempt)] = (rank, run)
                res = rt.call(ref.node, "launch", spec)
            except NodeUnavailable as e:
                res = {"ok": False, "error": f"node {ref.node}: {e}", "log": None}
                if run is None:
                    error = res["error"]
                    break
            if not res["ok"]:
                assert run is not None
                self._forget(run)
                rt.store.end_attempt(job, run.attempt, status="failed", at=rt.now(),
                                     end_iteration=None, checkpoint_iteration=None,
                                     start_iteration=None, log=res.get("log"))
                error = f"rank {rank}: {res['error']}"
                break
            assert run is not None
            started.append(run)
        if error:
            log.warning("gang %s: not started (%s); stopping %d started rank(s)", job, error,
                        len(started))
            self._kill(started)
            rt.store.update(job, state=JobStatus.QUEUED, gpu=None, placement=None, mps_pct=None)
            rt.store.log_event(rt.now(), "gang-failed", {"job": job, "reason": error})
            rt.post_event(GangFailed(job, d.plan_id, error))
            return
        fields: dict[str, Any] = {"state": JobStatus.RUNNING, "gpu": d.gpus[0],
                                  "placement": str(started[0].placement), "mps_pct": None}
        if rec.started_at is None:
            fields["started_at"] = now
        rt.store.update(job, **fields)
        rt.store.log_event(rt.now(), "gang-started", {"job": job, "gpus": list(d.gpus),
                                                     "master_port": port})
        rt.post_event(GangStarted(job, d.plan_id))

    def rendezvous_port(self, node: str | None) -> int:
        """``MASTER_PORT``: a port free on rank 0's node (its agent's ``free_port``), else,
        from an agent without it or unreachable (the launch then fails on its own), one free
        on this host."""
        if node is not None:
            try:
                port = self.rt.call(node, "free_port")
            except (NodeUnavailable, AttributeError):
                port = None
            if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
                return port
        return free_port()

    def stop(self, job: str) -> None:
        """Checkpoint every rank together (ask, wait, kill the late ones); back to queued."""
        runs = self.runs(job)
        for r in runs:
            r.stopping = True
        self.launcher.stop(runs)
        for r in runs:
            self._forget(r)
        rec = self.rt.job(job)
        if rec is not None and not rec.terminal:
            self.rt.store.update(job, state=JobStatus.QUEUED, gpu=None, placement=None,
                                 mps_pct=None)

    # ---- ends -----------------------------------------------------------------------------

    def end(self, job: str, *, finished: bool) -> None:
        """``job`` finished, failed or was cancelled: end every rank still running (after
        :data:`FINISH_GRACE_S` when it finished: the other ranks exit by themselves)."""
        if job not in self._jobs:
            return
        runs = [r for r in self.runs(job) if not r.done.is_set()]
        if not runs:
            return
        if not finished:
            for r in runs:
                r.stopping = True

        def later() -> None:
            if finished:
                deadline = time.monotonic() + FINISH_GRACE_S
                for r in runs:
                    r.done.wait(max(0.0, deadline - time.monotonic()))
            self._kill([r for r in runs if not r.done.is_set()])

        threading.Thread(target=later, name=f"miso-gang-end-{job}", daemon=True).start()

    def node_lost(self, node: str) -> list[str]:
        """End every gang with a rank on ``node``: its ranks there are recorded lost, the
        others are killed; returns those jobs (the caller requeues them)."""
        rt = self.rt
        with rt.lock:
            hit = {r.job for r in rt.runs.values() if r.node == node and r.job in self._jobs}
            hit |= {j for (j, _), (_, r) in self.others.items() if r.node == node}
        now = rt.now()
        for job in sorted(hit):
            runs = self.runs(job)
            for r in runs:
                r.stopping = True
            elsewhere = [r for r in runs if r.node != node]
            for r in runs:
                if r.node == node and r.job in self._jobs and self._is_other(r):
                    self._forget(r)
                    r.status = "lost"
                    r.done.set()
                    rt.store.end_attempt(job, r.attempt, status="lost", at=now,
                                         end_iteration=None, checkpoint_iteration=None,
                                         start_iteration=None)
            log.warning("gang %s: node %s lost; ending its %d rank(s) elsewhere", job, node,
                        len(elsewhere))
            rt.store.log_event(now, "gang-lost", {"job": job, "node": node})
            threading.Thread(target=self._kill, args=(elsewhere,), daemon=True).start()
            rec = rt.job(job)
            if rec is not None and not rec.terminal:
                rt.store.update(job, state=JobStatus.QUEUED, gpu=None, placement=None,
                                mps_pct=None)
        return sorted(hit)

    # ---- agents' reports of ranks >= 1 ----------------------------------------------------

    def rank_report(self, node: str, a: dict[str, Any]) -> bool:
        """Handle one agent report entry if it is a rank >= 1 of a gang; False otherwise.
        Such a rank's progress is rank 0's business; its exit is recorded, and an exit
        nobody asked for fails the job (the other ranks are then ended)."""
        if not self.others:  # no gang rank anywhere (most reports): skip the lock
            return False
        key = (str(a["job"]), int(a["attempt"]))
        rt = self.rt
        with rt.lock:
            hit = self.others.get(key)
        if hit is None:
            return False
        rank, run = hit
        if run.node != node:
            return False
        run.last = a
        if a["status"] == "running":
            return True
        rt.record_end(a, rt.now())
        self._forget(run)
        run.status = a["status"]
        run.done.set()
        rt.try_call(node, "forget", run.job, run.attempt)
        if not run.stopping and a["status"] != "finished":
            rt.post_event(JobFailed(run.job, f"rank {rank}: exit code {a.get('returncode')}"))
        return True

    # ---- helpers --------------------------------------------------------------------------

    def _is_other(self, r: Run) -> bool:
        with self.rt.lock:
            return (r.job, r.attempt) in self.others

    def _forget(self, r: Run) -> None:
        with self.rt.lock:
            self.others.pop((r.job, r.attempt), None)
        self.rt.drop_run(r)

    def _kill(self, runs: list[Run]) -> None:
        """Kill ``runs`` now; their ends are recorded from the agents' reports."""
        for r in runs:
            r.stopping = True
        for r in runs:
            self.rt.try_call(r.node, "kill", r.job, r.attempt)
        for r in runs:
            if not r.done.wait(10 + 5 * self.rt.cfg.poll_interval):
                log.error("gang %s attempt %d: no exit seen after kill", r.job, r.attempt)
                self._forget(r)

    def _wait_gone(self, job: str) -> bool:
        """Wait until no run of ``job`` is live (a previous start's ranks being stopped)."""
        rt = self.rt
        deadline = time.monotonic() + rt.cfg.checkpoint_timeout + rt.cfg.call_timeout
        while self.runs(job):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True
