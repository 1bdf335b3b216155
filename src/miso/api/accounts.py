"""The account routes of the API: users and their tokens, the audit record, owners' quotas
and weights, accounts above users (fair share's first level). See :mod:`miso.api.app` for
the list of endpoints; every route here but ``/users/me`` and a user's own token rotation is
an admin's."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Query

from miso.api.auth import AdminDep, ApiError, Json, UserDep
from miso.api.models import AccountRequest, QuotaRequest, UserRequest
from miso.api.users import User, UserError, UserStore
from miso.api.wire import API
from miso.controller.quotas import FIELDS as QUOTA_FIELDS
from miso.jobstatus import JobStatus


class Quotas:
    """The controller's quota store as the routes ask it (501 when the server keeps none)."""

    def __init__(self, controller: Any, users: UserStore) -> None:
        self.controller = controller
        self.users = users

    def store(self) -> Any:
        qs = getattr(self.controller, "quotas", None)
        if qs is None:
            raise ApiError(501, "this server keeps no quotas")
        return qs

    def check_priority_allowed(self, priority: int, user: User) -> None:
        """403 unless ``user`` may ask for ``priority`` (admins, or up to its limit)."""
        if user.admin or priority <= 0:
            return
        q = self.store().get(user.id)
        limit = q.priority_limit if q is not None and q.priority_limit is not None else 0
        if priority > limit:
            raise ApiError(403, f"priority {priority} is above what user {user.name!r} may ask "
                                f"for ({limit}); an admin may raise it (miso quota set "
                                f"{user.name} --priority-limit N)")

    def user(self, name: str) -> User:
        try:
            return self.users.get(name)
        except UserError:
            raise ApiError(404, f"no user {name!r}") from None

    def to_json(self, u: User, q: Any) -> dict[str, Any]:
        base = {"owner": u.name, "id": u.id, "weight": None, "max_in_use": None,
                "max_queued": None, "priority_limit": None}
        if q is not None:
            base.update({k: getattr(q, k) for k in QUOTA_FIELDS})
        limits = getattr(self.controller, "time_limits", None)
        max_time = limits.max_time(u.id) if limits is not None else None
        if max_time is not None:
            base["max_time_s"] = max_time
        return base


def accounts_router(controller: Any, users: UserStore, quotas: Quotas) -> APIRouter:
    """The routes of users, tokens, the audit record, quotas and accounts."""
    quota_store, quota_user, quota_json = quotas.store, quotas.user, quotas.to_json
    r = APIRouter(prefix=API)

    @r.get("/users/me")
    async def me(user: UserDep) -> dict[str, Any]:
        return user.to_json()

    @r.get("/users")
    async def list_users(_: AdminDep) -> dict[str, Any]:
        return {"users": users.list()}

    @r.post("/users", status_code=201)
    async def add_user(body: UserRequest, admin: AdminDep) -> dict[str, Any]:
        try:
            token = users.add(body.name, admin=body.admin, unix_user=body.unix_user)
        except UserError as e:
            raise ApiError(409 if "exists" in str(e) else 400, str(e)) from None
        users.record(admin.name, "user-add", None, {"name": body.name, "admin": body.admin,
                                                   "unix_user": body.unix_user})
        return {**users.get(body.name).to_json(), "token": token}

    @r.delete("/users/{name}")
    def remove_user(name: str, admin: AdminDep) -> dict[str, Any]:
        """Refused while the user has running jobs (as Slurm refuses); its queued jobs are
        cancelled (none runs later under its account)."""
        try:
            uid = users.get(name).id
        except UserError as e:
            raise ApiError(404, str(e)) from None
        running = [r.id for r in controller.store.jobs(active_only=True, owner=uid)
                   if r.state != JobStatus.QUEUED]
        if running:
            raise ApiError(409, f"{name!r} has running jobs ({', '.join(running[:10])}): "
                                "cancel them first")
        try:
            users.remove(name)
        except UserError as e:
            raise ApiError(404 if "no user" in str(e) else 409, str(e)) from None
        cancelled = _cancel_all(uid)  # after the removal: none can be submitted since
        users.record(admin.name, "user-remove", None, {"name": name, "cancelled": cancelled})
        return {"removed": name, "cancelled": cancelled}

    def _cancel_all(owner: str) -> list[str]:
        from miso.controller import SubmitError  # noqa: PLC0415

        out = []
        for rec in controller.store.jobs(active_only=True, owner=owner):
            with contextlib.suppress(SubmitError):
                controller.cancel(rec.id)
                out.append(rec.id)
        return out

    @r.post("/users/{name}/rotate")
    async def rotate(name: str, user: UserDep) -> dict[str, Any]:
        if not user.admin and name != user.name:
            raise ApiError(403, "only admins rotate another user's token")
        try:
            token = users.rotate(name)
        except UserError as e:
            raise ApiError(404, str(e)) from None
        users.record(user.name, "token-rotate", None, {"name": name})
        return {"name": name, "token": token}

    @r.get("/audit")
    async def audit(_: AdminDep, user: str | None = None,
              limit: Annotated[int, Query(ge=1, le=100_000)] = 1000) -> dict[str, Any]:
        return {"audit": users.audit(user=user, limit=limit)}

    @r.get("/quotas")
    async def quotas(_: AdminDep) -> Json:
        qs = quota_store()
        info = controller.tenancy_info() if hasattr(controller, "tenancy_info") else {}
        byid = {q.owner: q for q in qs.list()}
        known = {u["id"]: u["name"] for u in users.list()}
        rows = [{**q.to_json(), "owner": known.get(o, q.name), "id": o}
                for o, q in byid.items()]
        members, weights = qs.accounts() if hasattr(qs, "accounts") else ({}, {})
        for row in rows:
            row["account"] = members.get(row["id"])
        return Json({"tenancy": info, "quotas": rows,
                     "accounts": {a: weights.get(a) for a in
                                  sorted(set(members.values()) | set(weights))},
                     "account_members": {known.get(o, o): a for o, a in members.items()}})

    @r.get("/quotas/{name}")
    async def quota(name: str, _: AdminDep) -> Json:
        u = quota_user(name)
        return Json({"quota": quota_json(u, quota_store().get(u.id))})

    @r.put("/quotas/{name}")
    def set_quota(name: str, body: QuotaRequest, admin: AdminDep) -> Json:
        qs = quota_store()
        u = quota_user(name)
        fields = {k: getattr(body, k) for k in body.model_fields_set}
        if "account" in fields:  # the account above the user (fair share's first level)
            if not hasattr(controller, "set_account"):
                raise ApiError(501, "this server keeps no accounts")
            controller.set_account(u.id, u.name, fields.pop("account"))
        limits = getattr(controller, "time_limits", None)
        if "max_time_s" in fields:  # kept beside the quotas (:mod:`...timelimits`)
            if limits is None:
                raise ApiError(501, "this server keeps no time limits")
            limits.set_max_time(u.id, fields.pop("max_time_s"))
        try:
            q = controller.set_quota(u.id, u.name, **fields) if fields or limits is None \
                else qs.get(u.id)  # type: ignore[attr-defined]
        except ValueError as e:
            raise ApiError(400, " ".join(str(e).split())) from None
        users.record(admin.name, "quota-set", None, {"name": u.name, **fields})
        info = controller.tenancy_info() if hasattr(controller, "tenancy_info") else {}
        return Json({"quota": quota_json(u, q if q is not None else qs.get(u.id)),
                     "tenancy": info})

    @r.put("/accounts/{account}")
    def set_account(account: str, body: AccountRequest, admin: AdminDep) -> Json:
        if not hasattr(controller, "set_account_weight"):
            raise ApiError(501, "this server keeps no accounts")
        try:
            controller.set_account_weight(account, body.weight)
        except ValueError as e:
            raise ApiError(400, " ".join(str(e).split())) from None
        users.record(admin.name, "account-set", None, {"account": account,
                                                       "weight": body.weight})
        return Json({"account": account, "weight": body.weight})

    @r.delete("/quotas/{name}")
    def clear_quota(name: str, admin: AdminDep) -> Json:
        quota_store()
        u = quota_user(name)
        gone = controller.clear_quota(u.id)  # type: ignore[attr-defined]
        limits = getattr(controller, "time_limits", None)
        if limits is not None and limits.max_time(u.id) is not None:
            limits.set_max_time(u.id, None)
            gone = True
        users.record(admin.name, "quota-clear", None, {"name": u.name})
        return Json({"cleared": u.name, "had_quota": bool(gone)})

    return r
