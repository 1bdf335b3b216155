"""The body of ``GET /api/v1/status`` (not the summary): the cluster view as one user may see
it (:mod:`miso.api.statusview`: other users' jobs as counts), a page of job records, each
with its one line of why it waits or runs (:mod:`miso.controller.statustext`) and its
priority, counts, and, with tenancy on, owners and the fair slices' regime."""

from __future__ import annotations

from typing import Any

from miso.api.auth import ApiError
from miso.api.statusview import gpu_view
from miso.api.users import User, UserError, UserStore
from miso.controller.owners import owner_view
from miso.jobstatus import JobStatus


def status_page(snap: dict[str, Any], user: User, store: Any, controller: Any,
                users: UserStore, api_url: str | None, *, limit: int, offset: int,
                state: str | None, owner: str | None) -> dict[str, Any]:
    """The page ``user`` asked for (``limit``, ``offset``, ``state``, ``owner``) of the
    controller's snapshot ``snap`` and its job ``store``; 400 / 403 / 404 as
    :class:`ApiError`."""
    from miso.controller.schema import STATES  # noqa: PLC0415
    from miso.controller.statustext import SnapIndex, why  # noqa: PLC0415
    from miso.controller.store import StoreError  # noqa: PLC0415
    if state is not None and state not in STATES:
        raise ApiError(400, f"unknown state {state!r} (one of {', '.join(STATES)})")
    own = None if user.admin else user.id
    if owner is not None:
        if not user.admin and owner != user.name:
            raise ApiError(403, "only admins list other users' jobs")
        try:
            own = users.get(owner).id
        except UserError:
            raise ApiError(404, f"no user {owner!r}") from None
    recs = store.jobs(owner=own, limit=limit, state=state, offset=offset)
    placed = {j for g in snap.get("gpus", []) for j in g.get("jobs", [])}
    mine: set[str] | None = None
    if not user.admin:
        mine = {j for j, o in store.owners(placed).items() if o == user.id}

    qs = getattr(controller, "quotas", None)
    prio = qs.priorities(r.id for r in recs) if qs is not None else {}
    # the placed jobs that cannot checkpoint, read once for the page: a queued job's line
    # looks at every placed job (one store read each was seconds per page at 1,000 jobs)
    pinned = store.pinned(placed) if any(x.state == JobStatus.QUEUED for x in recs) \
        else {}

    def cannot_checkpoint(job: str) -> bool:
        return job in pinned

    def owner_of(job: str) -> str | None:
        if job in pinned:
            return pinned[job][1]
        try:
            return store.get(job).owner_name
        except StoreError:
            return None

    def job_name(job: str) -> str:
        """A pinned job as this reader may see it: named when it is theirs (or an
        admin reads), else "another user's job"."""
        if job in pinned:
            owner, name = pinned[job][0], pinned[job][2]
        else:
            try:
                rec = store.get(job)
            except StoreError:
                return "a job there"
            owner, name = rec.owner, rec.name
        if user.admin or owner == user.id:
            return f"job {job} ({name})" if name and name != job else f"job {job}"
        return "another user's job"

    index = SnapIndex(snap, cannot_checkpoint)  # one pass over the GPUs for the page
    out: dict[str, Any] = {
        "api_url": api_url, "user": user.name, "admin": user.admin,
        "time": snap.get("time"), "policy": snap.get("policy"),
        "nodes": snap.get("nodes", []), "lost_nodes": snap.get("lost_nodes", []),
        "gpus": [gpu_view(g, mine) for g in snap.get("gpus", [])],
        "jobs": [{**x.to_json(), "why": why(x.to_json(), snap, cannot_checkpoint,
                                             admin=user.admin, owner_of=owner_of,
                                             job_name=job_name, index=index),
                  "priority": prio.get(x.id, 0)} for x in recs],
        "counts": {"mine": store.counts(owner=user.id), "all": snap.get("counts", {})},
    }
    if user.admin:
        out["errors"] = snap.get("errors", [])
        out["queue"] = snap.get("queue", [])
    if snap.get("owners") is not None:
        out["owners"] = owner_view(snap["owners"], None if user.admin else user.id,
                                   user.name)
    if snap.get("fair_slices") is not None:  # the fair slices' regime and budget
        out["fair_slices"] = snap["fair_slices"]
    return out
