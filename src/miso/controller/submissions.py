"""A job's submission to the live controller: checked (request, priority, gang, the owner's
queued-jobs quota and time limit, a pinned profile, the largest slice), stored, and posted to
the scheduling loop.

Units: ``memory_gb`` is in GB (10^9 bytes), as the ``--memory-gb`` flag; MIG slices are sized
in GiB (2^30 bytes); the submission converts (40 GB = 37.3 GiB).
"""

from __future__ import annotations

from miso.controller.gangs import check_gang_request
from miso.controller.quotas import QuotaStore, check_priority
from miso.controller.requests import dependency_ids, pinned_memory
from miso.controller.runtime import QuotaExceeded, Runtime, SubmitConflict, SubmitError
from miso.controller.store import GIB_PER_GB, JobStore, StoreConflict, StoreError
from miso.controller.submitcheck import (
    check_request,
    cluster_geometries,
    job_spec,
    largest_slice,
)
from miso.controller.timelimits import TimeLimitStore
from miso.jobstatus import JobStatus
from miso.sched import ClusterState, JobSubmitted
from miso.sched.tenancyconfig import queued_quota_reason


class Submissions:
    """The controller's submissions (see the module docstring): ``state`` is the loop's (read
    for whether tenancy is on), ``owner_names`` the controller's owner id -> user name."""

    def __init__(self, rt: Runtime, store: JobStore, quotas: QuotaStore,
                 time_limits: TimeLimitStore, state: ClusterState,
                 owner_names: dict[str, str]) -> None:
        self.rt = rt
        self.store = store
        self.quotas = quotas
        self.time_limits = time_limits
        self.state = state
        self.owner_names = owner_names

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
        rt = self.rt
        command, workload, memory_gb, gib = check_request(
            command, env, unix_user, workload, memory_gb, host_memory_gb,
            check_commands=rt.cfg.check_commands)
        try:
            priority = check_priority(priority)
        except ValueError as e:
            raise SubmitError(str(e)) from None
        if priority and self.state.tenancy is None:
            raise SubmitError(f"priority {priority}: this cluster runs one FIFO queue; "
                              "priorities need tenancy (miso cluster up --fair-share)")
        check_gang_request(num_gpus, nodes, len(rt.gpus))
        self.check_queued_quota(owner, owner_name)
        ten = rt.cfg.tenancy
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
            gib, memory_gb = pinned_memory(profile, gib, cluster_geometries(rt))
        after = dependency_ids(self.store, after or [], owner)
        biggest, where = largest_slice(rt)
        if gib > biggest + 1e-9:
            raise SubmitError(f"job needs {memory_gb:g} GB ({gib:.2f} GiB), more than the "
                              f"largest slice of any GPU ({where}: {biggest:g} GiB = "
                              f"{biggest / GIB_PER_GB:.1f} GB)")
        try:
            rec = self.store.submit(command=command, name=name, memory_gb=memory_gb,
                                    memory_gib=gib, workload=workload, env=env, cwd=cwd,
                                    at=rt.now(), owner=owner, unix_user=unix_user,
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
        rt.job_added()
        rt.post_event(JobSubmitted(job_spec(rec, priority, ahead)))
        return rec.id

    def check_queued_quota(self, owner: str | None, owner_name: str | None) -> None:
        """Refuse (one line) a submission of an owner at its queued-jobs quota (enforced
        whether tenancy is on or not: it needs only the store)."""
        o = owner or ""
        ten = self.rt.cfg.tenancy
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
