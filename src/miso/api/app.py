"""The HTTP API of a miso cluster (FastAPI): versioned JSON under ``/api/v1/``.

``create_app(controller, users)`` builds the app over any object with the
:class:`~miso.controller.Controller`'s public methods (``submit``, ``cancel``, ``cluster``,
``logs``) and its job store (``controller.store``), and a :class:`~miso.api.users.UserStore`.
It is served by the cluster head (:mod:`miso.api.server`) and tested in-process.

Every endpoint needs ``Authorization: Bearer <token>``: no or an unknown token is 401. A user
sees and acts on their own jobs only (another user's job is 403); admins see and act on all.
Jobs belong to the user's id (:mod:`miso.api.users`), not its name: a re-created name is a new
user. The cluster view shows every GPU and layout, with other users' jobs as counts. A
``request_id`` repeated with another request is 409. Errors are
``{"error": "..."}`` with the status code; bodies are size-limited (413) and validated (422).

Endpoints::

    POST   /api/v1/jobs                 submit            -> 201 {"id", "name"}
    GET    /api/v1/jobs                 list own jobs     ?active=1&limit=N (admin: &all=1)
    GET    /api/v1/jobs/{job}           one job (id, or name among the user's own)
    GET    /api/v1/jobs/{job}/logs      its output        ?tail=N -> {"job", "text"}
    POST   /api/v1/jobs/{job}/cancel    cancel            -> {"job": record}
    GET    /api/v1/status               cluster view, own jobs, counts, "api_url"
                                        ?limit=N&offset=K&state=S (admin: &owner=NAME);
                                        ?summary=true: counts and totals only (no lists)
    GET    /api/v1/users/me             who am I
    GET    /api/v1/users                (admin) list users
    POST   /api/v1/users                (admin) add a user -> 201 {..., "token"} (shown once)
    DELETE /api/v1/users/{name}         (admin) remove a user
    POST   /api/v1/users/{name}/rotate  (admin, or the user itself) new token
    GET    /api/v1/audit                (admin) who submitted / cancelled what, when
    GET    /api/v1/quotas               (admin) every owner's weight and quotas, tenancy
    GET    /api/v1/quotas/{name}        (admin) one user's
    PUT    /api/v1/quotas/{name}        (admin) set some of them (null clears one)
    DELETE /api/v1/quotas/{name}        (admin) back to the defaults
    PUT    /api/v1/accounts/{name}      (admin) an account's fair-share weight (users join one
                                        with ``account`` in PUT /quotas/{name})
    GET    /healthz                     (no token) 200, or 503 while the loop is dead or stuck

A submission may ask for a ``priority`` (``high``, ``normal``, ``low`` or an integer): above
``normal`` only admins, or users up to the ``priority_limit`` an admin gave them (403
otherwise). A submission over the user's queued-jobs quota is 429 with the one-line reason.
With tenancy on, ``status`` has ``owners``: usage against entitlement per owner
(:mod:`miso.controller.owners`; a user who is not an admin sees its own row and the others
as one row of counts).

Endpoints that only touch the store (fast, local SQLite) run on the event loop; ``logs`` and
``cancel``, which wait on agents and the controller loop, run in the thread pool.

More routes (metrics, web page, events) are mounted with ``create_app(...,
extra_routers=[router])`` or ``app.include_router(router)``; such routes can require a user
with the :func:`require_user` / :func:`require_admin` dependencies.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from miso.api.limits import BodySizeLimit
from miso.api.models import AccountRequest, QuotaRequest, SubmitRequest, UserRequest
from miso.api.statusview import ClusterSnapshot, gpu_view, status_summary
from miso.api.users import User, UserError, UserStore
from miso.api.wire import API, MAX_BODY_BYTES
from miso.controller.owners import owner_view
from miso.controller.quotas import FIELDS as QUOTA_FIELDS
from miso.jobstatus import JobStatus


class ControllerLike(Protocol):
    """What the API needs of a controller: its public methods and its job store."""

    store: Any

    def submit(self, command: list[str], *, name: str | None = None,
               memory_gb: float | None = None, workload: str | None = None,
               env: dict[str, str] | None = None, cwd: str | None = None,
               owner: str | None = None, unix_user: str | None = None,
               request_id: str | None = None, owner_name: str | None = None,
               priority: int = 0, host_memory_gb: float | None = None,
               num_gpus: int = 1, nodes: int | None = None, profile: str | None = None,
               after: list[str] | None = None) -> str: ...

    def cancel(self, job: str) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    def cluster(self) -> dict[str, Any]: ...

    def logs(self, job: str, tail: int = 200) -> str: ...


class ApiError(HTTPException):
    """An error answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)


# ---- authentication (dependencies, usable by mounted routers too) ---------------------------


async def require_user(request: Request) -> User:
    """The user of the request's bearer token; 401 without a valid one."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "missing token: send 'Authorization: Bearer <token>' "
                                 "(miso login)", headers={"WWW-Authenticate": "Bearer"})
    user = request.app.state.users.authenticate(token.strip())
    if user is None:
        raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
    return user


async def require_admin(user: Annotated[User, Depends(require_user)]) -> User:
    """As :func:`require_user`, and 403 unless the user is an admin."""
    if not user.admin:
        raise ApiError(403, f"user {user.name!r} is not an admin")
    return user


UserDep = Annotated[User, Depends(require_user)]
AdminDep = Annotated[User, Depends(require_admin)]


# ---- views ----------------------------------------------------------------------------------


class Json(JSONResponse):
    """A JSON answer of plain data, serialised directly (FastAPI's generic encoder costs
    milliseconds for a page of job records)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=str, separators=(",", ":")).encode()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "invalid request: " + "; ".join(parts)


# ---- the app --------------------------------------------------------------------------------


def create_app(controller: ControllerLike, users: UserStore, *, api_url: str | None = None,
               extra_routers: Iterable[APIRouter] = (), max_body_bytes: int = MAX_BODY_BYTES,
               snapshot_ttl: float = 0.2) -> FastAPI:
    """The API app over ``controller`` and ``users`` (see the module docstring)."""
    from miso.controller.store import StoreError  # noqa: PLC0415

    # no open schema or docs pages: every API answer needs a token
    app = FastAPI(title="miso", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.controller = controller
    app.state.users = users
    app.state.api_url = api_url
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    store = controller.store
    snapshot = ClusterSnapshot(controller, snapshot_ttl)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            return _error(422, "invalid request: the body is not JSON")  # e.g. not UTF-8
        return _error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, _validation_message(exc))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error: {type(exc).__name__}")

    def find_job(job: str, user: User) -> Any:
        try:
            rec = store.get(job, owner=None if user.admin else user.id)
        except StoreError:
            raise ApiError(404, f"no job {job!r}") from None
        if not user.admin and rec.owner != user.id:
            raise ApiError(403, f"job {rec.id} belongs to another user")
        return rec

    def quota_store() -> Any:
        qs = getattr(controller, "quotas", None)
        if qs is None:
            raise ApiError(501, "this server keeps no quotas")
        return qs

    def check_priority_allowed(priority: int, user: User) -> None:
        if user.admin or priority <= 0:
            return
        q = quota_store().get(user.id)
        limit = q.priority_limit if q is not None and q.priority_limit is not None else 0
        if priority > limit:
            raise ApiError(403, f"priority {priority} is above what user {user.name!r} may ask "
                                f"for ({limit}); an admin may raise it (miso quota set "
                                f"{user.name} --priority-limit N)")

    def quota_user(name: str) -> User:
        try:
            return users.get(name)
        except UserError:
            raise ApiError(404, f"no user {name!r}") from None

    def quota_json(u: User, q: Any) -> dict[str, Any]:
        base = {"owner": u.name, "id": u.id, "weight": None, "max_in_use": None,
                "max_queued": None, "priority_limit": None}
        if q is not None:
            base.update({k: getattr(q, k) for k in QUOTA_FIELDS})
        limits = getattr(controller, "time_limits", None)
        max_time = limits.max_time(u.id) if limits is not None else None
        if max_time is not None:
            base["max_time_s"] = max_time
        return base

    r = APIRouter(prefix=API)

    @r.post("/jobs", status_code=201)
    async def submit(body: SubmitRequest, user: UserDep) -> Json:
        from miso.controller import QuotaExceeded, SubmitConflict, SubmitError  # noqa: PLC0415

        # a retry (same client-chosen request id) gets the job of the first call
        retry: dict[str, Any] = {"request_id": f"{user.id}:{body.request_id}"} \
            if body.request_id else {}
        if body.priority:
            check_priority_allowed(body.priority, user)
            retry["priority"] = body.priority
        if body.host_memory_gb is not None:
            retry["host_memory_gb"] = body.host_memory_gb
        if body.time_limit_s is not None:
            retry["time_limit_s"] = body.time_limit_s
        if body.num_gpus != 1 or body.nodes is not None:  # a gang
            retry.update(num_gpus=body.num_gpus, nodes=body.nodes)
        if body.profile is not None or body.after:  # --profile, --after
            retry.update(profile=body.profile, after=list(body.after))
        try:
            jid = controller.submit(list(body.command), name=body.name,
                                    memory_gb=body.memory_gb, workload=body.workload,
                                    env=dict(body.env), cwd=body.cwd, owner=user.id,
                                    unix_user=user.unix_user, owner_name=user.name, **retry)
        except SubmitError as e:
            conflict = isinstance(e, SubmitConflict) or "names are unique" in str(e)
            over = isinstance(e, QuotaExceeded)
            raise ApiError(409 if conflict else 429 if over else 400,
                           " ".join(str(e).split())) from None
        users.record(user.name, "submit", jid, {"name": body.name, "argv0": body.command[0]})
        return Json({"id": jid, "name": body.name or jid}, status_code=201)

    @r.get("/jobs")
    async def jobs(user: UserDep, active: bool = False,
             limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
             all_users: Annotated[bool, Query(alias="all")] = False) -> Json:
        if all_users and not user.admin:
            raise ApiError(403, "only admins list every user's jobs")
        owner = None if all_users else user.id
        recs = store.jobs(active_only=active, owner=owner, limit=limit)
        return Json({"jobs": [x.to_json() for x in recs]})

    @r.get("/jobs/{job}")
    async def job(job: str, user: UserDep) -> Json:
        return Json({"job": find_job(job, user).to_json()})

    @r.get("/jobs/{job}/logs")
    def logs(job: str, user: UserDep,
             tail: Annotated[int, Query(ge=1, le=100_000)] = 200) -> dict[str, Any]:
        rec = find_job(job, user)
        return {"job": rec.id, "text": controller.logs(rec.id, tail)}

    @r.post("/jobs/{job}/cancel")
    def cancel(job: str, user: UserDep) -> dict[str, Any]:
        from miso.controller import SubmitError  # noqa: PLC0415

        rec = find_job(job, user)
        try:
            out = controller.cancel(rec.id)
        except SubmitError as e:
            raise ApiError(409, str(e)) from None
        users.record(user.name, "cancel", rec.id, {"owner": rec.owner})
        return {"job": out}

    @r.get("/status")
    async def status(user: UserDep, limit: Annotated[int, Query(ge=1, le=100_000)] = 200,
                     offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
                     state: str | None = None, owner: str | None = None,
                     summary: bool = False) -> Json:
        from miso.controller.schema import STATES  # noqa: PLC0415
        from miso.controller.statustext import SnapIndex, why  # noqa: PLC0415

        snap = snapshot.get()
        if summary:
            return Json(status_summary(snap, user, store.counts(owner=user.id),
                                       app.state.api_url))
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
            "api_url": app.state.api_url, "user": user.name, "admin": user.admin,
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
        return Json(out)

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

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        """No token: 200 while the scheduling loop runs and comes round, else 503 with why
        (for a load balancer or systemd watchdog; says nothing about jobs or users)."""
        check = getattr(controller, "health", None)
        problems = list(check()) if check is not None else []
        return JSONResponse({"ok": not problems, "problems": problems},
                            status_code=503 if problems else 200)

    app.include_router(r)
    for extra in extra_routers:
        app.include_router(extra)
    return app
