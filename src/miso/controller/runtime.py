"""Shared live state of one controller: its config, the runs, GPUs and nodes it knows, the
event queue to the loop, and the store and transport every part talks through.

The parts of the controller (:mod:`~miso.controller.loop`, :mod:`~miso.controller.executor`,
:mod:`~miso.controller.poller`, :mod:`~miso.controller.recovery`) share one :class:`Runtime`;
``Runtime.lock`` guards ``runs``, ``gpus`` and ``nodes``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miso.attemptstatus import AttemptStatus
from miso.controller.runtable import RunTable
from miso.controller.store import JobRecord, JobStore, StoreError
from miso.controller.storefile import BACKUP
from miso.mig import Geometry, Placement
from miso.nodeerrors import NodeUnavailable
from miso.sched import Event
from miso.sched.clock import Clock, WallClock
from miso.sched.tenancyconfig import TenancyConfig
from miso.transport.base import Transport

log = logging.getLogger(__name__)

#: The store is copied at most once per this many times what its last copy took.
BACKUP_COST_FACTOR = 10.0


class SubmitError(ValueError):
    """A job was refused at submission (clear message for the user)."""


class SubmitConflict(SubmitError):
    """The submission clashes with an earlier one (a request id reused for another job)."""


class QuotaExceeded(SubmitError):
    """The submitter is at its queued-jobs quota (``miso quota``): HTTP 429."""


#: What happens to a job past its time limit (:attr:`ControllerConfig.time_limit_action`).
TIME_LIMIT_ACTIONS = ("end", "requeue")


@dataclass
class ControllerConfig:
    """Knobs of the live controller. Times in seconds."""

    policy: str = "miso+"
    policy_args: dict[str, Any] = field(default_factory=dict)
    estimator: str = "auto"
    poll_interval: float = 0.2
    checkpoint_timeout: float = 10.0
    call_timeout: float = 30.0
    profile_seconds_per_level: float = 10.0
    profile_warmup_s: float = 0.3
    reprofile_cooldown_s: float = 600.0
    discover_interval: float = 2.0
    node_failures_to_lose: int = 2
    check_commands: bool = True
    #: Lease the controller grants each agent at every poll: an agent that hears nothing for
    #: this long has its jobs killed (fenced); a lost node's jobs restart elsewhere only after
    #: its last lease ran out.
    lease_s: float = 15.0
    #: Timeout of one poll of one agent (a hung agent is a failed poll).
    poll_timeout: float = 5.0
    #: Owners' usage, fair share, quotas and preemption (:mod:`miso.sched.tenancy`); None:
    #: one FIFO queue.
    tenancy: TenancyConfig | None = None
    #: Past its time limit (``miso submit --time``) a job is ``"end"``ed (checkpointed if it
    #: saves, then failed: the default), or with ``"requeue"`` a job that saves is
    #: checkpointed and put back in the queue, its limit counting per run (a time slice); a
    #: job that cannot save is ended either way (issue 26).
    time_limit_action: str = "end"
    #: fair share with neither a fairness price nor a fixed fair slice cap given: the price
    #: kept in the store (:func:`miso.controller.quotas.with_price`)
    fairness_price_stored: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.tenancy, dict):  # from JSON (``miso cluster up --fair-share``)
            ten = dict(self.tenancy)
            if ten.get("fairness_price") == "stored":
                del ten["fairness_price"]
                self.fairness_price_stored = True
            self.tenancy = TenancyConfig(**ten)
        if self.time_limit_action not in TIME_LIMIT_ACTIONS:
            raise ValueError(f"time_limit_action {self.time_limit_action!r}: expected one of "
                             f"{', '.join(TIME_LIMIT_ACTIONS)}")


@dataclass
class GpuRef:
    """A GPU the controller drives: ``id`` is ``<node>/<index>``."""

    id: str
    node: str
    index: int
    model: str
    geom: Geometry


@dataclass
class Run:
    """The live attempt of a job."""

    job: str
    attempt: int
    node: str
    gpu: str
    index: int
    placement: Placement
    mps_pct: int | None
    launched: float
    stopping: bool = False
    status: str = AttemptStatus.RUNNING
    last: dict[str, Any] = field(default_factory=dict)
    observed_sent: bool = False
    change_seq_sent: int = 0
    #: (monotonic time, iterations left, iterations/s) of the progress last sent to the loop
    #: (:func:`miso.controller.poller.progress_moved`); None: none sent yet.
    posted: tuple[float, float, float] | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Runtime:
    """What the controller's threads share. See the module docstring."""

    def __init__(self, store: JobStore, transport: Transport, cfg: ControllerConfig,
                 checkpoint_root: Path, clock: Clock | None = None) -> None:
        self.store = store
        #: the controller's clock (seconds since the store was created, so it survives a
        #: restart); tests inject a :class:`~miso.sched.clock.VirtualClock`. Wall time
        #: (``time.time()``) is used only where another process reads it: agent leases.
        self.clock: Clock = clock if clock is not None else WallClock(store.epoch)
        self.transport = transport
        self.cfg = cfg
        self.checkpoint_root = checkpoint_root
        self.lock = threading.RLock()
        self.runs: RunTable[Run] = RunTable()
        self.gpus: dict[str, GpuRef] = {}
        self.nodes: set[str] = set()
        #: Nodes declared lost whose lease has not run out yet (not polled, not rediscovered).
        self.fencing: set[str] = set()
        #: Nodes whose agent stopped answering or restarted, until their agent joins again:
        #: ``{node: {"since": wall clock, "why": one line}}`` (shown by ``status``).
        self.lost: dict[str, dict[str, Any]] = {}
        #: Latest lease end (wall clock) granted to each node.
        self.leases: dict[str, float] = {}
        self._horizon = 0.0
        #: Work directory of each node's agent (from its ``describe``).
        self.agent_dirs: dict[str, str] = {}
        #: node -> the address its agent advertises for a gang's rendezvous (agent/nodeaddr.py)
        self.node_addrs: dict[str, str] = {}
        self._backup_due = False
        self._last_backup = -1e9
        self._backup_cost = 0.0
        self._backup_timer: threading.Timer | None = None
        self.queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        #: the latest progress report of each job with a ("progress", jobs) item queued
        self._progress: dict[str, tuple[Any, ...]] = {}
        self._progress_lock = threading.Lock()
        #: per thread: jobs whose reports wait to be queued as one item (progress_batch)
        self._batch = threading.local()
        self.stopping = threading.Event()
        #: jobs the poller made finished in the store as their exit came (the loop need not
        #: write it again when it takes their ``JobFinished``: one statement less per job)
        self.finished_in_store: set[str] = set()
        self.errors: list[str] = []
        self._last_error: tuple[str, int] = ("", 0)
        #: optional observer (:class:`miso.observe.Observer`): metrics and the decision log
        self.observer: Any = None

    def backup_every(self) -> float:
        """Seconds between two copies of the store while jobs arrive: one, or ten times what
        the last copy took when that is longer (a big store copied every second would hold
        the store's lock most of the time; this keeps copying under a tenth of it)."""
        return max(1.0, BACKUP_COST_FACTOR * self._backup_cost)

    def job_added(self) -> None:
        """A job was submitted: back the store up now, or within :meth:`backup_every`
        seconds when the last copy is younger than that (see :meth:`backup_if_due`)."""
        self._backup_due = True
        every = self.backup_every()
        if time.monotonic() - self._last_backup >= every:
            self.backup_if_due()
            return
        with self.lock:
            if self._backup_timer is None or not self._backup_timer.is_alive():
                self._backup_timer = threading.Timer(every, self.backup_if_due)
                self._backup_timer.daemon = True
                self._backup_timer.start()

    def backup_if_due(self) -> None:
        """Copy the store to ``miso.db.bak`` when jobs were added since the last copy, so a
        lost or damaged store can be restored without losing a submitted job (their progress
        comes back from the checkpoint and exit records)."""
        with self.lock:
            if not self._backup_due or self.store.path == ":memory:":
                return
            self._backup_due = False
            self._last_backup = time.monotonic()
        try:
            t0 = time.monotonic()
            self.store.backup(Path(self.store.path).parent / BACKUP)
            self._backup_cost = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001 - e.g. disk full: try again after the next job
            self._backup_due = True
            log.warning("job store backup failed: %s", e)

    def now(self) -> float:
        """Controller clock: seconds since the store was created (survives restarts)."""
        return self.clock.now()

    def agent_dir(self, node: str) -> Path:
        """The agent work directory of ``node``: as it described it, else the default place
        under the state directory (``agents/<node>``)."""
        with self.lock:
            known = self.agent_dirs.get(node)
        return Path(known) if known else self.checkpoint_root.parent / "agents" / node

    def used_attempts(self, job: str) -> int:
        """The highest attempt number of ``job`` with a directory under any agent's work
        directory (0 if none): a store restored from its backup may not know them all."""
        with self.lock:
            dirs = {Path(d) for d in self.agent_dirs.values()}
        dirs |= set((self.checkpoint_root.parent / "agents").glob("*"))
        best = 0
        for d in dirs:
            for a in (d / "jobs" / job).glob("attempt-*"):
                n = a.name.rsplit("-", 1)[-1]
                if n.isdigit():
                    best = max(best, int(n))
        return best

    def post_event(self, ev: Event) -> None:
        """Hand an event to the loop thread (after the progress reports this thread's
        :meth:`progress_batch` holds: the loop takes them in the order posted)."""
        self._post_batch()
        self.queue.put(("event", ev, time.monotonic()))

    @contextlib.contextmanager
    def progress_batch(self) -> Iterator[None]:
        """Inside: this thread's :meth:`post_progress` calls queue one ``("progress", jobs)``
        item for all their jobs (queued before this thread's next event, and at the end),
        not one item per job: an agent's report of many running jobs is one item for the
        loop, and one wake-up of it, instead of one per job every poll."""
        self._batch.jobs = []
        try:
            yield
        finally:
            self._post_batch()
            self._batch.jobs = None

    def _post_batch(self) -> None:
        jobs = getattr(self._batch, "jobs", None)
        if jobs:
            self._batch.jobs = []
            self.queue.put(("progress", tuple(jobs)))

    def post_progress(self, job: str, gpu: str, placement: Placement, mps_pct: int | None,
                      iterations_left: float, rate: float) -> None:
        """Hand a job's progress report to the loop (it converts it to full-GPU seconds).
        Reports of a job coalesce: while one waits in the queue, a newer one replaces its
        values (the loop reads the latest, :meth:`take_progress`), so a loop behind a
        thousand running jobs' reports is not behind several reports of each."""
        with self._progress_lock:
            waiting = job in self._progress
            self._progress[job] = (gpu, placement, mps_pct, iterations_left, rate)
        if not waiting:
            batch = getattr(self._batch, "jobs", None)
            if batch is not None:
                batch.append(job)
            else:
                self.queue.put(("progress", (job,)))

    def take_progress(self, job: str) -> tuple[Any, ...] | None:
        """The latest progress report of ``job`` not handled yet (None: none waits)."""
        with self._progress_lock:
            return self._progress.pop(job, None)

    def error(self, msg: str) -> None:
        """Record an error shown in ``status()["errors"]`` (one repeated at once is kept
        once, with a count)."""
        last, n = self._last_error
        if self.errors and last == msg:
            self._last_error = (msg, n + 1)
            self.errors[-1] = f"{msg} [x{n + 1}]"
            return
        self._last_error = (msg, 1)
        self.errors.append(msg)
        del self.errors[:-100]

    def call(self, node: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Call an agent method; raises :class:`NodeUnavailable`."""
        return self.transport.call(node, method, *args,
                                   timeout=self.cfg.call_timeout if timeout is None else timeout)

    def report(self, node: str) -> dict[str, Any]:
        """Poll one agent, renewing its lease (recorded before the call: the agent may get it
        even when the answer is lost)."""
        # wall time: the agent's guard (another process) compares the lease with its clock
        until = time.time() + self.cfg.lease_s
        with self.lock:
            self.leases[node] = max(self.leases.get(node, 0.0), until)
            if until > self._horizon:
                # persisted ahead of the grant, so a restarted controller knows how long
                # the jobs of an unreachable node may still run
                self._horizon = until + self.cfg.lease_s / 2
                try:
                    self.store.lease_horizon = self._horizon
                except Exception as e:  # noqa: BLE001 - e.g. disk full: keep the node leased
                    log.warning("cannot persist the lease horizon: %s", e)
        rep: dict[str, Any] = self.call(node, "report", until, timeout=self.cfg.poll_timeout)
        return rep

    def try_call(self, node: str, method: str, *args: Any) -> Any:
        """Call an agent method; None when the node cannot be reached."""
        try:
            return self.call(node, method, *args)
        except NodeUnavailable:
            return None

    def job(self, job: str) -> JobRecord | None:
        """The job's record, or None when the store does not know it."""
        try:
            return self.store.get(job)
        except StoreError:
            return None

    def runs_on(self, gpu: str) -> list[Run]:
        with self.lock:
            return self.runs.on(gpu)

    def drop_run(self, run: Run) -> None:
        """Forget ``run`` if it is still the job's live attempt."""
        with self.lock:
            if self.runs.get(run.job) is run:
                del self.runs[run.job]

    def record_end(self, a: dict[str, Any], at: float) -> None:
        """Store the end of an attempt from an agent's report of it."""
        if a.get("checkpoint_iteration") is not None:
            self.store.progress(a["job"], checkpoint_iteration=a["checkpoint_iteration"],
                                checkpoint_path=a["checkpoint_path"])
        if a.get("iteration") is not None:
            self.store.progress(a["job"], iteration=a["iteration"], total=a.get("total"))
        self.store.end_attempt(a["job"], a["attempt"], status=a["status"], at=at,
                               end_iteration=a.get("iteration"),
                               checkpoint_iteration=a.get("checkpoint_iteration"),
                               start_iteration=a.get("start_iteration"), log=a.get("log"))
