"""The live controller: the shared scheduling core (:mod:`miso.sched`) driving real agents.

:class:`Controller` is the public face (``start``, ``stop``, ``submit``, ``cancel``,
``status``, ``logs``, ``wait_all``); it wires the parts, each in its own module:

* :mod:`~miso.controller.loop` - the event loop, the only owner of the scheduling state and
  the policy;
* :mod:`~miso.controller.executor` - the plan executor, one worker thread per GPU;
* :mod:`~miso.controller.poller` - agent discovery and polling (progress, exits, speeds);
* :mod:`~miso.controller.recovery` - what happens at start after a crash;
* :mod:`~miso.controller.submitcheck` - what a submission is checked for;
* :mod:`~miso.controller.runtime` - the state they share (runs, GPUs, nodes, the queue).

One controller per state directory: :meth:`Controller.start` takes an OS lock
(:mod:`~miso.controller.statelock`) that the kernel drops when the process dies.

Units: ``submit(memory_gb=...)`` is in GB (10^9 bytes), as the ``--memory-gb`` flag; MIG
slices are sized in GiB (2^30 bytes); the controller converts (40 GB = 37.3 GiB).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from miso import runtimedir
from miso.controller.executor import PlanExecutor
from miso.controller.gangs import check_gang_request
from miso.controller.gctune import tune_gc
from miso.controller.loop import EventLoop
from miso.controller.owners import owner_table
from miso.controller.poller import AgentPoller
from miso.controller.quotas import (
    Quota,
    QuotaStore,
    check_priority,
    tenancy_config,
    with_price,
)
from miso.controller.recovery import recover
from miso.controller.requests import dependency_ids, pinned_memory
from miso.controller.runtime import (
    ControllerConfig,
    QuotaExceeded,
    Runtime,
    SubmitConflict,
    SubmitError,
)
from miso.controller.statelock import StateDirLock
from miso.controller.statustext import (
    NO_NODES,
    SnapIndex,
    fair_named,
    lost_node,
    owner_named,
    why,
)
from miso.controller.store import GIB_PER_GB, JobStore, StoreConflict, StoreError
from miso.controller.submitcheck import (
    check_request,
    cluster_geometries,
    job_spec,
    largest_slice,
)
from miso.controller.timelimits import TimeLimitStore
from miso.controller.usagestore import UsageStore
from miso.jobstatus import JobStatus
from miso.nodeerrors import NodeUnavailable
from miso.sched import JobSubmitted, Policy
from miso.sched.clock import Clock
from miso.sched.estimators import make_estimator
from miso.sched.gangs import GangLayer, with_gangs
from miso.sched.policies import build_policy, policy_options
from miso.sched.tenancyconfig import queued_quota_reason
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
        self._base_tenancy = with_price(cfg.tenancy, self.quotas, cfg.fairness_price_stored)
        self.cfg = replace(cfg, tenancy=tenancy_config(self._base_tenancy, self.quotas.list(),
                                                       self.quotas.accounts()))
        self._retune_lock = threading.Lock()
        #: owner id -> user name, for the per-owner view (from submissions and quotas)
        self.owner_names: dict[str, str] = {q.owner: q.name for q in self.quotas.list()}
        root = checkpoint_root or (
            Path(store.path).parent / "checkpoints" if store.path != ":memory:"
            else runtimedir.process_private("miso-ckpt-"))
        self.checkpoint_root = Path(root)
        self.rt = Runtime(store, transport, self.cfg, self.checkpoint_root, clock)
        #: ``policy`` (tests) replaces the one ``config`` names
        self.policy = policy if policy is not None else make_controller_policy(self.cfg)
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

    def submit(self, command: list[str], *, name: str | None = None,
               memory_gb: float | None = None, workload: str | None = None,
               env: dict[str, str] | None = None, cwd: str | None = None,
               owner: str | None = None, unix_user: str | None = None,
               request_id: str | None = None, owner_name: str | None = None,
               priority: int = 0, host_memory_gb: float | None = None,
               time_limit_s: float | None = None, num_gpus: int = 1,
               nodes: int | None = None, profile: str | None = None,
               after: list[str] | None = None, ahead: bool = False) -> str:
        """Queue a job; returns its id. Raises :class:`SubmitError` on bad input.

        ``memory_gb`` is the job's peak GPU memory in GB (10^9 bytes). ``env`` is added to the
        job's environment. ``owner`` is the id of the API user submitting it (None: the local
        operator), ``owner_name`` its name; ``unix_user`` the account its processes run as
        where the agent runs as root. ``request_id`` (chosen by the client) makes a retry
        safe: a second submission with the same id and request returns the first one's job;
        with another request it is a :class:`SubmitConflict`. ``priority`` (an integer,
        :func:`miso.sched.tenancy.parse_priority`) orders it before lower ones when tenancy is
        on; refused when it is off (it would do nothing). Who may ask for what is the API's
        check. ``time_limit_s``: the most it may run (``--time``; default and maximum: its
        owner's ``max_time``); past it it is checkpointed and ended. ``num_gpus`` > 1 makes
        it a gang on that many whole GPUs (``nodes``: spread over that many nodes, equal
        counts; :mod:`miso.controller.gangs`). ``profile`` pins it to one MIG profile (a GPU
        model of the cluster must have it; the job's memory is that slice's);
        ``after``: jobs (ids or names, the submitter's) that must end first
        (:mod:`miso.controller.requests`). ``ahead``: queued ahead of every other job (the
        head's service replicas only: :class:`~miso.sched.events.JobSpec`; the API never
        sets it).
        """
        command, workload, memory_gb, gib = check_request(
            command, env, unix_user, workload, memory_gb, host_memory_gb,
            check_commands=self.cfg.check_commands)
        try:
            priority = check_priority(priority)
        except ValueError as e:
            raise SubmitError(str(e)) from None
        if priority and self.loop.state.tenancy is None:
            raise SubmitError(f"priority {priority}: this cluster runs one FIFO queue; "
                              "priorities need tenancy (miso cluster up --fair-share)")
        check_gang_request(num_gpus, nodes, len(self.rt.gpus))
        self._check_queued_quota(owner, owner_name)
        ten = self.cfg.tenancy
        if ten is not None and (owner or "") in ten.max_queued:
            o = owner or ""
            n = sum(1 for r in self.store.jobs() if r.state == JobStatus.QUEUED
                    and (r.owner or "") == o)
            refused = queued_quota_reason(o, n, ten.max_queued[o])
            if refused is not None:
                raise SubmitError(refused)
        try:
            limit = self.time_limits.limit_for(owner or "", time_limit_s)
        except ValueError as e:
            raise SubmitError(str(e)) from None
        if profile is not None:
            gib, memory_gb = pinned_memory(profile, gib, cluster_geometries(self.rt))
        after = dependency_ids(self.store, after or [], owner)
        biggest, where = largest_slice(self.rt)
        if gib > biggest + 1e-9:
            raise SubmitError(f"job needs {memory_gb:g} GB ({gib:.2f} GiB), more than the "
                              f"largest slice of any GPU ({where}: {biggest:g} GiB = "
                              f"{biggest / GIB_PER_GB:.1f} GB)")
        try:
            rec = self.store.submit(command=command, name=name, memory_gb=memory_gb,
                                    memory_gib=gib, workload=workload, env=env, cwd=cwd,
                                    at=self.now(), owner=owner, unix_user=unix_user,
                                    request_id=request_id, owner_name=owner_name,
                                    host_memory_gb=host_memory_gb,
                                    num_gpus=num_gpus, nodes=nodes, profile=profile,
                                    after=after)
        except StoreConflict as e:
            raise SubmitConflict(str(e)) from None
        except StoreError as e:
            raise SubmitError(str(e)) from None
        self.quotas.set_priority(rec.id, priority)
        if limit is not None:
            self.time_limits.set_job(rec.id, limit)
        if owner and owner_name:
            self.owner_names[owner] = owner_name
        self.rt.job_added()
        self.rt.post_event(JobSubmitted(job_spec(rec, priority, ahead)))
        return rec.id

    def _check_queued_quota(self, owner: str | None, owner_name: str | None) -> None:
        """Refuse (one line) a submission of an owner at its queued-jobs quota (enforced
        whether tenancy is on or not: it needs only the store)."""
        o = owner or ""
        ten = self.cfg.tenancy
        cap = ten.max_queued.get(o) if ten is not None else None
        if cap is None:
            return
        if owner is not None:
            n = self.store.counts(owner=owner).get("queued", 0)
        else:
            n = sum(1 for r in self.store.jobs(active_only=True) if r.state == "queued"
                    and not r.owner)
        refused = queued_quota_reason(owner_name or o, n, cap)
        if refused is not None:
            raise QuotaExceeded(refused)

    # ---- quotas (admin: the API checks who asks) ----------------------------------------

    def set_quota(self, owner: str, name: str, **fields: Any) -> Quota | None:
        """Set some of ``owner``'s weight and quotas (:data:`miso.controller.quotas.FIELDS`;
        None clears one) durably; the next scheduling decision uses them. ValueError on a
        value out of bounds. Returns the row (None when every field is back to its default)."""
        q = self.quotas.set(owner, name, **fields)
        self.owner_names[owner] = name
        self._retune()
        return None if q.empty else q

    def set_account(self, owner: str, name: str, account: str | None) -> None:
        """Put ``owner`` in ``account`` (None: none) durably; the next decision uses it."""
        self.quotas.set_account(owner, account)
        self.owner_names[owner] = name
        self._retune()

    def set_account_weight(self, account: str, weight: float | None) -> None:
        """Set ``account``'s weight (None: the default) durably; the next decision uses it."""
        self.quotas.set_account_weight(account, weight)
        self._retune()

    def clear_quota(self, owner: str) -> bool:
        """Forget ``owner``'s weight and quotas (defaults again)."""
        gone = self.quotas.clear(owner)
        self._retune()
        return gone

    def tenancy_info(self) -> dict[str, Any]:
        """Whether tenancy is on and with which options (``quota show``)."""
        ten = self.cfg.tenancy
        if ten is None:
            return {"on": False}
        return {"on": True, "fair_share": ten.fair_share, "half_life_s": ten.half_life_s,
                "preempt": ten.preempt, "min_run_s": ten.min_run_s,
                "default_weight": ten.default_weight, "fairness_price": ten.fairness_price,
                "live": self.loop.state.tenancy is not None}

    def _retune(self) -> None:
        """Give the loop the tenancy of the stored quotas (it swaps it in between two
        events). A cluster started without tenancy enforces the queued-jobs quota now and
        the rest from its next start."""
        with self._retune_lock:  # read and hand over in one go: the last change wins
            cfg = tenancy_config(self._base_tenancy, self.quotas.list(),
                                 self.quotas.accounts())
            if cfg is None and self.loop.state.tenancy is not None:
                cfg = replace(self.loop.state.tenancy.config, weights={}, max_in_use={},
                              max_queued={})
            self.cfg = replace(self.cfg, tenancy=cfg)
            self.rt.cfg = self.cfg
            if cfg is not None and self.loop.state.tenancy is not None:
                self.rt.queue.put(("tenancy", cfg))

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

    def status(self, limit: int | None = None) -> dict[str, Any]:
        """GPUs (layout, phase, jobs) and jobs (state, slice, speed, progress, and ``why``: one
        line on why it waits, or its full failure reason); ``limit``: the latest jobs only
        (a page; the counts are ``store.counts()``)."""
        snap = self.cluster()
        jobs = [r.to_json() for r in self.store.jobs(limit=limit)]
        pinned = {j["id"] for j in jobs if j.get("checkpointable") is False}
        names = {j["id"]: j.get("owner_name") for j in jobs}
        index = SnapIndex(snap, pinned.__contains__)  # one pass over the GPUs for all lines
        for j in jobs:
            j["why"] = why(j, snap, pinned.__contains__, owner_of=names.get,
                           job_name=lambda x: f"job {x}", index=index)
        snap["jobs"] = jobs
        if not snap["nodes"] and any(j["state"] == JobStatus.QUEUED for j in jobs):
            fencing = snap["unreachable"]
            snap["errors"].append(NO_NODES if not fencing else
                                  f"every agent is unreachable ({', '.join(fencing)}): jobs "
                                  f"wait until a node returns")
        return snap

    def cluster(self) -> dict[str, Any]:
        """:meth:`status` without the job records (cheap: no store read)."""
        snap = self.loop.snapshot()
        with self.rt.lock:
            snap["nodes"] = sorted(self.rt.nodes)
            snap["unreachable"] = sorted(self.rt.fencing)
            snap["lost_nodes"] = [lost_node(n, d, n in self.rt.fencing)
                                  for n, d in sorted(self.rt.lost.items())]
        snap["time"] = self.now()
        snap["policy"] = getattr(self.policy, "name", self.cfg.policy)
        if "owners" in snap:  # tenancy on: usage against entitlement per owner id
            ten = self.cfg.tenancy
            snap["owners"] = owner_table(snap["owners"], self.quotas.list(), self.owner_names,
                                         ten.default_weight if ten is not None else 1.0)
            # a quota's wait reason names the owner by its user name, not its id
            snap["held"] = {j: owner_named(t, self.owner_names)
                            for j, t in (snap.get("held") or {}).items()}
            snap["fair_wait"] = fair_named(snap.get("fair_wait") or {}, self.owner_names)
        snap["errors"] = self.health() + [n["text"] for n in snap["lost_nodes"]] + \
            list(self.errors[-20:]) + [
            f"job {b}: its record in the store is malformed; ignored (fix or delete the row "
            f"in {self.store.path})" for b in self.store.bad_rows]
        return snap

    def logs(self, job: str, tail: int = 200) -> str:
        """Output of every attempt of ``job``, fetched from the nodes that ran it."""
        rec = self.store.get(job)
        out = []
        for node in sorted({a["node"] for a in self.store.attempts(rec.id)}):
            try:
                out.append(self.transport.call(node, "logs", rec.id, tail,
                                               timeout=self.cfg.call_timeout))
            except NodeUnavailable:
                out.append(f"--- {rec.id}: node {node} unreachable ---")
        if rec.reason:
            out.append(f"--- {rec.id} {rec.state}: {rec.reason}")
        return "\n".join(x for x in out if x)

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

    # ---- helpers ------------------------------------------------------------------------
