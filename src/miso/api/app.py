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

Reads go to the store's read connection ``controller.store.reads`` where it has one (a read
never waits behind the controller's writers). The event loop runs only what holds nothing
up: one job's record and the status summary (answered from counts read with the cluster
snapshot, :mod:`miso.api.statusview`: no lock, no SQL on the loop); ``submit`` (it waits
for the store's writer lock, and submissions arriving together are written in one
transaction), ``logs`` and ``cancel`` (they wait on agents and the controller loop), the job
list and the status page (a page of records and the cluster's GPUs, built and rendered to
JSON there) run in the thread pool. In the controller's process every SQL row and blocking
call hands the interpreter lock to its busy threads (pollers, GPU workers, the loop) and
waits to get it back, so such work on the loop would hold up every request.

More routes (metrics, web page, events) are mounted with ``create_app(...,
extra_routers=[router])`` or ``app.include_router(router)``; such routes can require a user
with the :func:`require_user` / :func:`require_admin` dependencies.

By role: this module builds the app and holds the job routes and the status route;
:mod:`miso.api.auth` the token dependencies and the answer types; :mod:`miso.api.accounts`
the routes of users, tokens, the audit record, quotas and accounts;
:mod:`miso.api.statuspage` the status page's body (:mod:`miso.api.statusview` its summary and
GPU views).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from miso.api.accounts import Quotas, accounts_router
from miso.api.auth import AdminDep, ApiError, Json, UserDep, require_admin, require_user
from miso.api.limits import BodySizeLimit
from miso.api.models import SubmitRequest
from miso.api.statuspage import status_page
from miso.api.statusview import ClusterSnapshot, status_summary
from miso.api.users import User, UserStore
from miso.api.wire import API, MAX_BODY_BYTES

#: ``require_user``, ``require_admin``, ``UserDep``, ``AdminDep``, ``ApiError`` and ``Json``
#: live in :mod:`miso.api.auth`; they are importable from here too.
__all__ = ["AdminDep", "ApiError", "ControllerLike", "Json", "UserDep", "create_app",
           "require_admin", "require_user"]


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
    reads = getattr(store, "reads", store)  # the read connection (never waits for writers)
    snapshot = ClusterSnapshot(controller, snapshot_ttl)
    refreshing: set[asyncio.Future[None]] = set()  # the summary's background refreshes

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
            rec = reads.get(job, owner=None if user.admin else user.id)
        except StoreError:
            raise ApiError(404, f"no job {job!r}") from None
        if not user.admin and rec.owner != user.id:
            raise ApiError(403, f"job {rec.id} belongs to another user")
        return rec

    quotas = Quotas(controller, users)

    r = APIRouter(prefix=API)

    @r.post("/jobs", status_code=201)
    def submit(body: SubmitRequest, user: UserDep) -> Json:
        from miso.controller import QuotaExceeded, SubmitConflict, SubmitError  # noqa: PLC0415

        # a retry (same client-chosen request id) gets the job of the first call
        retry: dict[str, Any] = {"request_id": f"{user.id}:{body.request_id}"} \
            if body.request_id else {}
        if body.priority:
            quotas.check_priority_allowed(body.priority, user)
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
        snapshot.wrote(user.id)
        users.record(user.name, "submit", jid, {"name": body.name, "argv0": body.command[0]})
        return Json({"id": jid, "name": body.name or jid}, status_code=201)

    @r.get("/jobs")
    def jobs(user: UserDep, active: bool = False,
             limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
             all_users: Annotated[bool, Query(alias="all")] = False) -> Json:
        if all_users and not user.admin:
            raise ApiError(403, "only admins list every user's jobs")
        owner = None if all_users else user.id
        recs = reads.jobs(active_only=active, owner=owner, limit=limit)
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
        snapshot.wrote(user.id)
        if rec.owner:
            snapshot.wrote(rec.owner)
        users.record(user.name, "cancel", rec.id, {"owner": rec.owner})
        return {"job": out}

    @r.get("/status")
    async def status(user: UserDep, limit: Annotated[int, Query(ge=1, le=100_000)] = 200,
                     offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
                     state: str | None = None, owner: str | None = None,
                     summary: bool = False) -> Json:
        if summary:  # no lock, no SQL here: a part read off the event loop
            part = snapshot.summary_part(user.id)
            if part is None:
                part = await run_in_threadpool(snapshot.fresh_summary, user.id)
            elif snapshot.due():
                refresh = asyncio.ensure_future(run_in_threadpool(snapshot.refresh_if_due))
                refreshing.add(refresh)
                refresh.add_done_callback(refreshing.discard)
            return Json(status_summary(part, user, app.state.api_url))
        # built and rendered in the pool: a page of 1,024 GPUs is milliseconds of JSON that
        # would hold up every other request on the event loop
        return await run_in_threadpool(
            lambda: Json(status_page(snapshot.get(), user, reads, controller, users,
                                     app.state.api_url, limit=limit, offset=offset,
                                     state=state, owner=owner)))

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        """No token: 200 while the scheduling loop runs and comes round, else 503 with why
        (for a load balancer or systemd watchdog; says nothing about jobs or users)."""
        check = getattr(controller, "health", None)
        problems = list(check()) if check is not None else []
        return JSONResponse({"ok": not problems, "problems": problems},
                            status_code=503 if problems else 200)

    app.include_router(r)
    app.include_router(accounts_router(controller, users, quotas))
    for extra in extra_routers:
        app.include_router(extra)
    return app
