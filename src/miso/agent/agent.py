"""Per-node agent: changes MIG layouts through a GPU backend and runs jobs as real processes.

The agent takes orders (apply a layout, start/stop MPS on an instance, launch, checkpoint, kill)
and answers :meth:`Agent.report` with the state of every job attempt it runs: progress read from
the job's progress file, steady rate, speed changes (phase changes), exit status. It keeps no
scheduling logic; the controller decides. All methods return plain data (dicts/lists of
str/int/float), so the same object serves in-process and behind a Ray actor.

A job attempt is started with ``CUDA_VISIBLE_DEVICES=<MIG UUID>`` (from the backend) and, under
MPS, ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, plus the ``MISO_*``
variables of :mod:`miso.job` and the variables given at submission; the agent's own ``RAY_*``
and ``MISO_*`` variables are not passed on.

Nothing that runs as root takes a job's environment, files or paths: the guard starts with
an isolated interpreter (``python -I -S``) and a fixed environment
(:data:`miso.agent.launch.GUARD_ENV`); the job's
environment reaches the guard in a 0600 file of the agent's attempt directory and is applied
only to the job, after the drop to its owner's uid. Every file a job writes (progress, logs) is
read bounded, without following links, and checked (:mod:`miso.agent.reports`): a bad one
makes that attempt's ``report_error``, never an error of the agent's poll.

A job's processes are a set, not a process group: the guard holds them in a cgroup v2 where
the node has one, and as a child subreaper in any case; :meth:`Agent.kill` asks the guard to
end them all (``SIGHUP``), and sweeps leftovers by their ``MISO_ATTEMPT_TOKEN`` when the guard
is gone. Each log is capped at ``log_cap_mb`` MiB (``MISO_LOG_CAP_MB``; head and tail kept).

Fencing: every job runs under :mod:`miso.agent.guard`, which kills it when the controller's
lease (renewed by each :meth:`Agent.report` call that carries one) has run out or the agent has
died, and leaves an exit record in the attempt's (agent-owned) directory
(:func:`miso.nodewire.exit_record_path`), which the controller reads when the node is
unreachable.

This module is the agent's orders; one attempt's bookkeeping and report are
:mod:`miso.agent.attempt`, starting its process under the guard :mod:`miso.agent.launch`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from miso.agent import generation, jobprocs, logfile, runas
from miso.agent.attempt import (
    Attempt,
    RateTracker,
    attempt_report,
    refresh,
)
from miso.agent.bounds import JobBounds
from miso.agent.launch import job_base_env, log_cap_bytes, start_guarded
from miso.agent.nodeaddr import free_port, node_addr
from miso.backend.base import BackendError, GpuBackend, MpsHandle, ReconfigurationError
from miso.job import CHECKPOINT_SIGNAL
from miso.mig import Placement, canonical
from miso.nodewire import attempt_dir, exit_record_path, layout_data, placement_of

log = logging.getLogger(__name__)


class Agent:
    """The agent of one node: its GPU backend and the job processes it runs.

    ``workdir`` holds per-attempt logs, progress and flag files and MPS directories.
    """

    def __init__(self, node: str, backend: GpuBackend, workdir: str | Path, *,
                 rate_window: float = 1.0, change_threshold: float = 0.25,
                 python: str | None = None, no_helper_after: float = 3.0,
                 log_cap_mb: float | None = None, bounds: JobBounds | None = None) -> None:
        self.node = node
        #: what bounds each job on this node (processes, host memory, I/O, disk)
        self.bounds = bounds if bounds is not None else JobBounds.node_defaults()
        self.no_helper_after = no_helper_after
        self.backend = backend
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        self.rate_window = rate_window
        self.change_threshold = change_threshold
        self.python = python or sys.executable
        self.log_cap = log_cap_bytes(log_cap_mb)
        self._lock = threading.RLock()
        self._attempts: dict[tuple[str, int], Attempt] = {}
        #: attempts that are a gang's rank >= 1 (spec ``rank``): they write no progress
        #: (rank 0 does), so their silence does not mean they cannot checkpoint
        self._followers: set[tuple[str, int]] = set()
        self._mps: dict[tuple[int, Placement], MpsHandle] = {}
        self._closed = False
        self.lease_file = self.workdir / "lease"
        self._lease_fd: int | None = None
        self._lease_ro: int | None = None
        # this life's generation: every guard of an older one ends before anything starts
        self.generation = generation.bump(self.workdir)
        self._generation_ro = generation.reader(self.workdir)
        generation.fence_leftovers(self.workdir, self.generation)
        left = generation.leftover_guards(self.workdir, self.generation)
        if left:  # never launch beside an attempt of an older life (Ray starts us again)
            raise RuntimeError(f"{self.node}: {len(left)} guard(s) of an older agent could "
                               f"not be ended (pids {left[:5]}); not taking the node")

    # ---- lease --------------------------------------------------------------------------

    def renew_lease(self, until: float) -> None:
        """Extend the controller's lease to ``until`` (seconds since the epoch). Written in
        place (no new disk blocks), so a full disk does not fence the node."""
        with self._lock:
            try:
                if self._lease_fd is None:
                    self._lease_fd = os.open(self.lease_file, os.O_RDWR | os.O_CREAT, 0o644)
                os.pwrite(self._lease_fd, f"{until:20.3f}\n".encode(), 0)
            except OSError as e:
                log.warning("%s: cannot renew the lease file: %s", self.node, e)

    def _lease_reader(self) -> int:
        """A read-only descriptor of the lease file, inherited by every guard (so a guard
        running as the job's owner reads it whatever the directory permissions)."""
        if self._lease_ro is None:
            fd = os.open(self.lease_file, os.O_RDWR | os.O_CREAT, 0o644)
            os.close(fd)
            self._lease_ro = os.open(self.lease_file, os.O_RDONLY)
        return self._lease_ro

    # ---- description and layouts --------------------------------------------------------

    def ping(self) -> str:
        return self.node

    def free_port(self) -> int:
        """A TCP port free on this node now (a gang's ``MASTER_PORT`` when its rank 0 runs
        here: :mod:`miso.controller.gangs`)."""
        return free_port()

    def describe(self) -> dict[str, Any]:
        """Node id, backend and each GPU's model, MIG mode and current layout."""
        gpus = []
        for g in self.backend.gpus():
            devs = self.backend.devices(g.index)
            gpus.append({
                "index": g.index, "uuid": g.uuid, "model": g.model, "mig": g.mig_enabled,
                "layout": layout_data(devs),
                "devices": {f"{p.profile}@{p.start}": d.uuid for p, d in devs.items()},
                "driver": self.backend.geometry(g.index).driver,
                "profiles": [p.name for p in self.backend.geometry(g.index).profiles],
            })
        return {"node": self.node, "backend": self.backend.name, "pid": os.getpid(),
                "workdir": str(self.workdir), "gpus": gpus,
                "addr": node_addr()}  # a gang's rendezvous host (agent/nodeaddr.py)

    def apply_layout(self, gpu: int, layout: list[Any]) -> dict[str, Any]:
        """Apply a layout; ``{"ok", "layout", "error", "kind"}`` (layout read back)."""
        target = canonical(placement_of(x) for x in layout)
        with self._lock:
            self._stop_mps_not_in(gpu, set(target))
            try:
                now = self.backend.apply_layout(gpu, target)
                return {"ok": True, "layout": layout_data(now), "error": "", "kind": ""}
            except ReconfigurationError as e:
                log.warning("%s: %s", self.node, e)
                return {"ok": False, "layout": layout_data(e.layout), "error": str(e),
                        "kind": e.kind}
            except BackendError as e:
                return {"ok": False, "layout": layout_data(self.backend.read_layout(gpu)),
                        "error": str(e), "kind": e.kind}

    def read_layout(self, gpu: int) -> list[list[Any]]:
        return layout_data(self.backend.read_layout(gpu))

    # ---- MPS ----------------------------------------------------------------------------

    def start_mps(self, gpu: int, placement: Any) -> str:
        """Start (or reuse) the MPS daemon of one MIG device; returns its pipe directory."""
        pl = placement_of(placement)
        with self._lock:
            h = self._mps.get((gpu, pl))
            if h is None:
                h = self.backend.start_mps(gpu, pl, str(self.workdir / "mps"))
                self._mps[(gpu, pl)] = h
            return h.pipe_dir

    def stop_mps(self, gpu: int) -> None:
        """Stop every MPS daemon on ``gpu``."""
        with self._lock:
            self._stop_mps_not_in(gpu, set())

    def _stop_mps_not_in(self, gpu: int, keep: set[Placement]) -> None:
        for key in [k for k in self._mps if k[0] == gpu and k[1] not in keep]:
            try:
                self.backend.stop_mps(self._mps.pop(key))
            except BackendError as e:
                log.warning("%s: stopping MPS on GPU %d: %s", self.node, gpu, e)

    # ---- jobs ---------------------------------------------------------------------------

    def launch(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Start one attempt. ``spec`` keys: job, attempt, command, gpu, placement, mps_pct
        (None = plain MIG), checkpoint_dir, resume_from, env, cwd.

        Returns ``{"ok", "pid", "error", "log"}``; a command that cannot start is an error,
        not an exception.
        """
        job, attempt = str(spec["job"]), int(spec["attempt"])
        gpu, pl = int(spec["gpu"]), placement_of(spec["placement"])
        d = attempt_dir(self.workdir, job, attempt)
        log_file = d / "output.log"
        jd = d / "job"  # the job's own files (progress, checkpoint flag), owned by its account
        token = secrets.token_hex(12)
        with self._lock:
            if (job, attempt) in self._attempts:
                a = self._attempts[(job, attempt)]
                if a.returncode is None and a.proc.poll() is None:  # a retried launch call
                    return {"ok": True, "pid": a.proc.pid, "error": "", "log": str(log_file)}
            if generation.current(self._generation_ro) != self.generation:
                from miso.nodeerrors import NodeUnavailable  # noqa: PLC0415

                raise NodeUnavailable(f"the agent of {self.node} was replaced by a newer one "
                                      f"(generation {self.generation} is over): launch "
                                      "refused")
            if (job, attempt) in self._attempts or d.exists():
                return {"ok": False, "pid": None, "log": str(log_file),
                        "error": f"attempt {attempt} of {job} was run before on {self.node}: "
                                 f"attempt numbers are never reused"}
            d.mkdir(parents=True, exist_ok=True)
            try:
                acct = runas.account_for(spec.get("owner"), spec.get("unix_user"))
                ckpt = spec.get("checkpoint_dir")
                root = os.path.commonpath([self.workdir, ckpt]) if ckpt else self.workdir
                for p in (d.parent, d):
                    runas.private_dir(p, None, root=root)
                runas.private_dir(jd, acct, root=root)
                env = runas.base_env(acct, job_base_env())
                env.update(runas.check_env(spec.get("env")))
                env.update(self.backend.job_env(gpu, pl))
                env.update({
                    "MISO_JOB_ID": job, "MISO_ATTEMPT": str(attempt),
                    "MISO_PROGRESS_FILE": str(jd / "progress.json"),
                    "MISO_CHECKPOINT_FLAG": str(jd / "checkpoint.request"),
                    "MISO_NODE": self.node, "MISO_ATTEMPT_TOKEN": token,
                })
                env.update(runas.account_env(acct))
                record = exit_record_path(self.workdir, job, attempt)
                if ckpt:
                    runas.private_dir(ckpt, acct, root=root)
                    env["MISO_CHECKPOINT_DIR"] = str(ckpt)
                if spec.get("resume_from"):
                    env["MISO_RESUME_FROM"] = str(spec["resume_from"])
                mps = spec.get("mps_pct")
                if mps is not None:
                    env["CUDA_MPS_PIPE_DIRECTORY"] = self.start_mps(gpu, pl)
                    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(mps))
                cmd = [str(c) for c in spec["command"]]
                if cmd and cmd[0] in ("python", "python3") and self.python and \
                        not runas.switches(acct):  # another account finds its own python
                    cmd[0] = self.python
                cwd = spec.get("cwd") or None
                if not cmd or (shutil.which(cmd[0], path=env.get("PATH")) is None and
                               not Path(cwd or ".", cmd[0]).exists()):
                    raise OSError(f"{cmd[0] if cmd else ''!r} not found" + (
                        f" on the PATH of the job's account ({env.get('PATH')}): submit its "
                        "absolute path" if runas.switches(acct) else ""))
                record.unlink(missing_ok=True)
                proc = start_guarded(self.python, cmd, env, acct, attempt_dir=d, cwd=cwd,
                                     record=record, log_file=log_file, log_cap=self.log_cap,
                                     lease_fd=self._lease_reader(),
                                     bounds=self.bounds.guard_args(
                                         [p for p in (ckpt, jd) if p],
                                         spec.get("host_memory_gb")),
                                     fence=(self._generation_ro, self.generation))
            except (OSError, BackendError, ValueError) as e:
                msg = f"cannot start {spec.get('command')!r} on GPU {gpu} {pl}: {e}"
                log_file.write_text(msg + "\n")
                return {"ok": False, "pid": None, "error": msg, "log": str(log_file)}
            self._attempts[(job, attempt)] = Attempt(
                job, attempt, cmd, gpu, pl, None if mps is None else int(mps), proc, d,
                jd / "progress.json", jd / "checkpoint.request", log_file, time.time(),
                RateTracker(self.rate_window, self.change_threshold), exit_record=record,
                token=token)
            if int(spec.get("rank") or 0) > 0:
                self._followers.add((job, attempt))
            return {"ok": True, "pid": proc.pid, "error": "", "log": str(log_file)}

    def checkpoint(self, job: str, attempt: int) -> bool:
        """Ask an attempt to save and exit (signal + flag file). False if not running."""
        with self._lock:
            a = self._attempts.get((job, attempt))
            if a is None or a.proc.poll() is not None:
                return False
            a.checkpoint_requested = True
            runas.touch(a.flag_file)
            if a.progress_file.exists():
                # The helper is up (its handler is installed): signal it.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(a.proc.pid, CHECKPOINT_SIGNAL)
            elif (job, attempt) in self._followers:
                pass  # a gang's rank >= 1: its helper sees the flag file
            elif time.time() - a.started > self.no_helper_after:
                # Never reported progress: it does not use miso.job and cannot save.
                self._kill(a)
            # else: still starting; the helper will see the flag file when it starts.
            return True

    def kill(self, job: str, attempt: int) -> bool:
        """End every process of an attempt; waits for them to be gone."""
        with self._lock:
            a = self._attempts.get((job, attempt))
            if a is None:
                return False
            self._kill(a)
            return True

    def _kill(self, a: Attempt) -> None:
        """Ask the guard to end the job's processes (all of them, see the module docstring),
        then kill its group and sweep the attempt's token in case the guard could not."""
        if a.proc.poll() is None:
            a.killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(a.proc.pid, signal.SIGHUP)
            try:
                a.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.error("%s: guard %d did not end its job", self.node, a.proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(a.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            a.proc.wait(timeout=5)
        if jobprocs.end_cgroup(a.proc.pid):
            log.warning("%s: killed what %s attempt %d left in its cgroup", self.node, a.job,
                        a.attempt)
        if a.token:
            for _ in range(3):
                pids = jobprocs.token_pids(a.token)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            a.proc.wait(timeout=5)

    def forget(self, job: str, attempt: int) -> None:
        """Drop a finished attempt from reports (the controller has recorded its end)."""
        with self._lock:
            a = self._attempts.get((job, attempt))
            if a is not None and a.proc.poll() is not None:
                del self._attempts[(job, attempt)]
                self._followers.discard((job, attempt))

    def report(self, lease_until: float | None = None) -> dict[str, Any]:
        """Every attempt's state (see :func:`attempt_report`). With ``lease_until`` (seconds
        since the epoch) the controller's lease is renewed first."""
        if lease_until is not None:
            self.renew_lease(float(lease_until))
        with self._lock:
            jobs = []
            for a in list(self._attempts.values()):
                refresh(a, self.node, self.no_helper_after)
                jobs.append(attempt_report(a))
            return {"node": self.node, "time": time.time(), "jobs": jobs}

    def logs(self, job: str, tail: int = 200) -> str:
        """The last ``tail`` lines of every attempt log of ``job`` on this node (read from
        the end: the cost and the agent's memory follow ``tail``, not the log's size)."""
        root = self.workdir / "jobs" / job
        out = []
        atts = [d for d in root.glob("attempt-*") if d.name.split("-")[1].isdigit()]
        for d in sorted(atts, key=lambda p: int(p.name.split("-")[1])):
            try:
                lines = logfile.attempt_lines(d / "output.log", tail)
            except OSError:
                continue
            out.append(f"--- {job} {d.name} on {self.node} ---")
            out.extend(lines)
        return "\n".join(out)

    def running_pids(self) -> list[int]:
        with self._lock:
            return [a.proc.pid for a in self._attempts.values() if a.proc.poll() is None]

    def shutdown(self, *, destroy_instances: bool = False) -> None:
        """Kill every job process, stop MPS daemons, optionally clear the GPUs."""
        with self._lock:
            for a in self._attempts.values():
                self._kill(a)
            for g in {k[0] for k in self._mps}:
                self._stop_mps_not_in(g, set())
            if destroy_instances:
                for g in self.backend.gpus():
                    try:
                        self.backend.apply_layout(g.index, ())
                    except BackendError as e:
                        log.warning("%s: clearing GPU %d: %s", self.node, g.index, e)
            self._closed = True
