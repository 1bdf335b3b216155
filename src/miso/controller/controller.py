"""The live controller: the shared scheduling core (:mod:`miso.sched`) driving real agents.

:class:`Controller` is the public face (``start``, ``stop``, ``submit``, ``cancel``,
``status``, ``logs``, ``wait_all``); this module wires the parts together, starts and stops
them; each part is in its own module:

* :mod:`~miso.controller.loop` - the event loop, the only owner of the scheduling state and
  the policy;
* :mod:`~miso.controller.executor` - the plan executor, one worker thread per GPU;
* :mod:`~miso.controller.poller` - agent discovery and polling (progress, exits, speeds);
* :mod:`~miso.controller.recovery` - what happens at start after a crash;
* :mod:`~miso.controller.submissions` - a submission checked, stored and posted
  (:mod:`~miso.controller.submitcheck` what needs nothing of the running cluster);
* :mod:`~miso.controller.tenancyadmin` - owners' weights, quotas and accounts changed live;
* :mod:`~miso.controller.clusterview` - what ``status``, ``cluster`` and ``logs`` show;
* :mod:`~miso.controller.runtime` - the state they share (runs, GPUs, nodes, the queue).

One controller per state directory: :meth:`Controller.start` takes an OS lock
(:mod:`~miso.controller.statelock`) that the kernel drops when the process dies.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from miso import runtimedir
from miso.controller.clusterview import ClusterView
from miso.controller.executor import PlanExecutor
from miso.controller.gctune import tune_gc
from miso.controller.loop import EventLoop
from miso.controller.poller import AgentPoller
from miso.controller.quotas import Quota, QuotaStore, tenancy_config, with_price
from miso.controller.recovery import recover
from miso.controller.runtime import (
    ControllerConfig,
    QuotaExceeded,
    Runtime,
    SubmitConflict,
    SubmitError,
)
from miso.controller.statelock import StateDirLock
from miso.controller.store import JobStore
from miso.controller.submissions import Submissions
from miso.controller.submitcheck import job_spec
from miso.controller.tenancyadmin import TenancyAdmin
from miso.controller.timelimits import TimeLimitStore
from miso.controller.usagestore import UsageStore
from miso.sched import JobSubmitted, Policy
from miso.sched.clock import Clock
from miso.sched.estimators import make_estimator
from miso.sched.gangs import GangLayer, with_gangs
from miso.sched.policies import build_policy, policy_options
from miso.transport.base import Transport

__all__ = [
    "Controller", "ControllerConfig", "QuotaExceeded", "SubmitConflict", "SubmitError",
]


def make_controller_policy(cfg: ControllerConfig) -> Policy:
    """The policy ``cfg.policy`` with the controller's estimator and profiling knobs."""
    defaults: dict[str, Any] = {
        "profile_seconds_per_level": cfg.profile_seconds_per_level,
        "reprofile_cooldown_s": cfg.reprofile_cooldown_s,
    }
    if "estimator" in policy_options(cfg.policy) and "estimator" not in cfg.policy_args:
        defaults["estimator"] = make_estimator(cfg.estimator)
    return build_policy(cfg.policy, defaults, **cfg.policy_args)


class Controller:
    """Controller over a :class:`JobStore` and a transport to agents. See the module docstring."""

    def __init__(self, store: JobStore, transport: Transport,
                 config: ControllerConfig | None = None, *,
                 checkpoint_root: str | Path | None = None, clock: Clock | None = None,
                 policy: Policy | None = None) -> None:
        self.store = store
        self.transport = transport
        cfg = config or ControllerConfig()
        #: owners' weights and quotas and jobs' priorities (:mod:`miso.controller.quotas`)
        self.quotas = QuotaStore(store.path)
        #: owners' decayed usage, kept across restarts (:mod:`miso.controller.usagestore`)
        self.usage = UsageStore(store.path)
        #: jobs' time limits and owners' maximum time (:mod:`miso.controller.timelimits`)
        self.time_limits = TimeLimitStore(store.path)
        #: the tenancy the operator asked for (``--fair-share``), before the stored quotas
        base = with_price(cfg.tenancy, self.quotas, cfg.fairness_price_stored)
        cfg = replace(cfg, tenancy=tenancy_config(base, self.quotas.list(),
                                                  self.quotas.accounts()))
        #: owner id -> user name, for the per-owner view (from submissions and quotas)
        self.owner_names: dict[str, str] = {q.owner: q.name for q in self.quotas.list()}
        root = checkpoint_root or (
            Path(store.path).parent / "checkpoints" if store.path != ":memory:"
            else runtimedir.process_private("miso-ckpt-"))
        self.checkpoint_root = Path(root)
        self.rt = Runtime(store, transport, cfg, self.checkpoint_root, clock)
        #: ``policy`` (tests) replaces the one ``config`` names
        self.policy = policy if policy is not None else make_controller_policy(cfg)
        # gangs beside the policy, always (a live cluster may get one any time); without a
        # multi-GPU job the layer passes everything through: one-GPU decisions are unchanged
        self.policy = with_gangs(self.policy) if not isinstance(self.policy, GangLayer) \
            else self.policy
        self.executor = PlanExecutor(self.rt)
        self.loop = EventLoop(self.rt, self.executor, self.policy, self.cfg.policy)
        self.loop.stops.time_limits = self.time_limits
        self.loop.on_ledger = self.usage.save
        self.poller = AgentPoller(self.rt, self.executor)
        self._dir_lock: StateDirLock | None = None
        #: the request-facing parts, each its own job
        self.submissions = Submissions(self.rt, store, self.quotas, self.time_limits,
                                       self.loop.state, self.owner_names)
        self.tenancy_admin = TenancyAdmin(self.rt, self.quotas, self.loop.state,
                                          self.owner_names, base)
        self.view = ClusterView(self.rt, store, self.loop, self.policy, self.quotas,
                                self.owner_names, lambda: self.health())

    @property
    def cfg(self) -> ControllerConfig:
        """The configuration, with the tenancy of the stored quotas (the runtime's: one copy,
        replaced when an admin changes a quota)."""
        return self.rt.cfg

    @cfg.setter
    def cfg(self, cfg: ControllerConfig) -> None:
        self.rt.cfg = cfg

    @property
    def observer(self) -> Any:
        """The observer the loop calls (:class:`miso.observe.Observer`), or None."""
        return self.rt.observer

    @observer.setter
    def observer(self, obs: Any) -> None:
        self.rt.observer = obs

    @property
    def errors(self) -> list[str]:
        """Errors seen so far (policy contract breaches, failed executions)."""
        return self.rt.errors

    def now(self) -> float:
        """Controller clock: seconds since the store was created (survives restarts)."""
        return self.rt.now()

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> Controller:
        """Lock the state directory, recover from the store, discover agents, start the
        threads. Raises :class:`~miso.controller.statelock.StateDirLocked` when another
        controller runs on the same store."""
        if self.store.path != ":memory:":
            self._dir_lock = StateDirLock(Path(self.store.path).parent).acquire()
        recover(self.rt)
        self.restore_usage()
        self.poller.discover(force=True)
        active = self.store.jobs(active_only=True)
        prio = self.quotas.priorities(r.id for r in active)
        for rec in active:
            if rec.owner and rec.owner_name:
                self.owner_names.setdefault(rec.owner, rec.owner_name)
            self.rt.post_event(JobSubmitted(job_spec(rec, prio.get(rec.id, 0))))
        tune_gc()  # once per process: start-up's objects frozen, fewer full collections
        self.loop.start()
        self.poller.start()
        return self

    def health(self) -> list[str]:
        """What keeps the controller from scheduling (empty: healthy), for ``/healthz`` and
        the status errors. A loop thread found dead is started again once per call (the
        watchdog); it stays reported until the restarted thread comes round."""
        problems = self.loop.health()
        if problems and not self.loop.alive() and not self.rt.stopping.is_set():
            self.rt.error(problems[0] + "; restarted")
            self.loop.start()
        return problems

    def restore_usage(self) -> None:
        """Settle the owners' usage kept in the store at now (recovery has just stopped every
        job) and start the core's ledger from it: fair share remembers who used what before
        a restart. Before any job is placed (:meth:`start` calls it after recovery)."""
        recs = self.usage.settle(self.now())
        if self.loop.state.tenancy is not None:
            self.loop.state.tenancy.restore(recs, self.now())

    def stop(self, *, stop_jobs: bool = False) -> None:
        """Stop the threads; with ``stop_jobs`` also kill every job process (shutdown)."""
        self.rt.stopping.set()
        self.executor.close()
        self.loop.join(10)
        self.poller.join(10)
        if stop_jobs:
            for node in self.transport.nodes():
                self.rt.try_call(node, "shutdown")
            self.usage.settle(self.now())  # the jobs stopped: the time down is not charged
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    # ---- public API (thread-safe) -------------------------------------------------------

    def submit(self, command: list[str], **request: Any) -> str:
        """Queue a job; returns its id. Raises :class:`SubmitError` on bad input; the
        keywords (memory, owner, priority, time limit, gang, profile, ``after``, ...) are
        :meth:`Submissions.submit`'s."""
        return self.submissions.submit(command, **request)

    # ---- quotas (admin: the API checks who asks) ----------------------------------------

    def set_quota(self, owner: str, name: str, **fields: Any) -> Quota | None:
        """Set some of ``owner``'s weight and quotas (:meth:`TenancyAdmin.set_quota`)."""
        return self.tenancy_admin.set_quota(owner, name, **fields)

    def set_account(self, owner: str, name: str, account: str | None) -> None:
        """Put ``owner`` in ``account`` (None: none) durably; the next decision uses it."""
        self.tenancy_admin.set_account(owner, name, account)

    def set_account_weight(self, account: str, weight: float | None) -> None:
        """Set ``account``'s weight (None: the default) durably; the next decision uses it."""
        self.tenancy_admin.set_account_weight(account, weight)

    def clear_quota(self, owner: str) -> bool:
        """Forget ``owner``'s weight and quotas (defaults again)."""
        return self.tenancy_admin.clear_quota(owner)

    def tenancy_info(self) -> dict[str, Any]:
        """Whether tenancy is on and with which options (``quota show``)."""
        return self.tenancy_admin.info()

    def make_room(self, job: str) -> None:
        """Checkpoint one running job so that queued ``job``, a service replica of the head
        (submitted ``ahead``), gets a slice; nothing when none makes room
        (:meth:`~miso.controller.loop.EventLoop.make_room`)."""
        self.loop.make_room(job)

    def cancel(self, job: str) -> dict[str, Any]:
        """Cancel a job (kills its process); returns its record."""
        rec = self.store.get(job)
        if rec.terminal:
            raise SubmitError(f"job {rec.id} is already {rec.state}")
        done = threading.Event()
        self.rt.queue.put(("cancel", rec.id, done))
        done.wait(timeout=30)
        return self.store.get(rec.id).to_json()

    # ---- views (:mod:`miso.controller.clusterview`) --------------------------------------

    def status(self, limit: int | None = None) -> dict[str, Any]:
        """GPUs, jobs and why each waits (:meth:`ClusterView.status`)."""
        return self.view.status(limit)

    def cluster(self) -> dict[str, Any]:
        """:meth:`status` without the job records (cheap: no store read)."""
        return self.view.cluster()

    def logs(self, job: str, tail: int = 200) -> str:
        """Output of every attempt of ``job``, fetched from the nodes that ran it."""
        return self.view.logs(job, tail)

    def idle(self) -> bool:
        """True when no job is active and nothing is being executed."""
        return not self.executor.busy() and not self.store.jobs(active_only=True) and \
            self.rt.queue.empty()

    def wait_all(self, timeout: float) -> bool:
        """Wait until every job is terminal; False on timeout."""
        deadline = time.monotonic() + timeout  # real time: the caller's patience
        while time.monotonic() < deadline:
            if not self.store.jobs(active_only=True):
                return True
            time.sleep(0.2)
        return False
