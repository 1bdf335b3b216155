"""HTTP routes of the observability side, as a FastAPI router to mount on the API server.

* ``GET /`` and ``GET /static/{name}`` - the web page (package data under ``web/``; no data in
  it: the page asks for a token once and calls the JSON endpoints with it);
* ``GET /metrics`` - Prometheus text exposition of the controller's registry (for a reader
  who is not an admin, other users' jobs are counted under ``owner="other"``);
* ``GET /api/v1/events?job=&gpu=&since=&limit=`` - decision records, oldest first, each with
  its ``text``;
* ``GET /api/v1/cluster`` - the view the page draws (:func:`miso.observe.view.cluster_view`),
  with ``owners`` when tenancy is on (:func:`miso.controller.owners.owner_view`: a reader who
  is not an admin sees its own row and the others as counts).

``auth`` guards the JSON endpoints and ``metrics_auth`` ``/metrics`` (FastAPI dependencies, e.g.
the API's bearer-token check); None leaves them open (loopback tests, a read-only server on
127.0.0.1). :func:`instrument` adds API request latency to the metrics.
"""

# No ``from __future__ import annotations`` here: FastAPI must evaluate the endpoints'
# ``Depends(...)`` annotations where they are defined (they name the factory's local ``who``).

import time
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Response

from miso.controller.owners import owner_view
from miso.observe.decisionwords import describe
from miso.observe.eventlog import read_records
from miso.observe.metrics import CONTENT_TYPE, mask_owners
from miso.observe.observer import Observer
from miso.observe.view import cluster_counts, cluster_view, job_ids_in, mask, mentioned_jobs

STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}


class StatusSource(Protocol):
    def status(self) -> Mapping[str, Any]: ...


#: Jobs the web page shows (the latest; every state's count is in the metrics and status).
PAGE_JOBS = 1000


@cache
def _asset(name: str) -> bytes:
    return (resources.files("miso.observe") / "web" / name).read_bytes()


Visible = Callable[[Any], set[str] | None]


def owner_scope(store: Any) -> Visible:
    """Job ids a user of :mod:`miso.api` may see: all for admins (None), else their own."""

    def visible(user: Any) -> set[str] | None:
        if user is None or getattr(user, "admin", False):
            return None
        return {r.id for r in store.jobs(owner=user.id)}

    return visible


def scoped_snapshot(snap: Mapping[str, Any], seen: set[str]) -> dict[str, Any]:
    """``snap`` for a reader who may see the jobs ``seen`` only: other job records dropped
    (names, owners, commands and all), and error lines that name one of them dropped."""
    jobs = list(snap.get("jobs") or [])
    hidden = [j for j in jobs if str(j.get("id")) not in seen]
    words = {str(x) for j in hidden for x in (j.get("id"), j.get("name"), j.get("owner_name"),
                                              j.get("owner")) if x}
    words |= {str(x) for g in snap.get("gpus") or [] for x in g.get("jobs") or []
              if str(x) not in seen}
    return {**snap, "jobs": [j for j in jobs if str(j.get("id")) in seen],
            "errors": [e for e in snap.get("errors") or []
                       if not any(w in str(e) for w in words)]}


def _nobody() -> None:
    return None


def metrics_reader(user: Any) -> str | None:
    """The ``owner`` label a reader of ``/metrics`` may see beside ``other``: everything for
    admins (None), their own name for a user, nothing (``""``) for an anonymous reader."""
    if user is not None and getattr(user, "admin", False):
        return None
    return str(getattr(user, "name", "")) if user is not None else ""


def observe_router(source: StatusSource, observer: Observer, *,
                   auth: Callable[..., Any] | None = None,
                   metrics_auth: Callable[..., Any] | None = None,
                   visible: Visible | None = None,
                   log_path: str | Path | None = None, recent: int = 30) -> APIRouter:
    """The router (see the module docstring). ``visible(principal)`` (principal: what
    ``auth`` returns) gives the job ids the reader may see (None: all); other users' jobs
    are then shown as "other". ``log_path``: the decision log file that ``/api/v1/events``
    reads (default: the records the observer keeps in memory)."""
    router = APIRouter()
    who = auth if auth is not None else _nobody
    mwho = metrics_auth if metrics_auth is not None else _nobody
    path = Path(log_path) if log_path is not None else (
        observer.log.path if observer.log is not None else None)

    @router.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(_asset("index.html"), media_type=STATIC["index.html"],
                        headers={"Cache-Control": "no-cache"})

    @router.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in STATIC:
            raise HTTPException(404, "no such file")
        return Response(_asset(name), media_type=STATIC[name],
                        headers={"Cache-Control": "no-cache"})

    @router.get("/metrics")
    def metrics(principal: Annotated[Any, Depends(mwho)]) -> Response:
        if observer.metrics is None:
            raise HTTPException(404, "metrics are off")
        text = observer.metrics.render()
        if metrics_auth is not None or visible is not None:
            keep = metrics_reader(principal)
            if keep is not None:
                text = mask_owners(text, keep)
        return Response(text, media_type=CONTENT_TYPE)

    def scope(principal: Any) -> set[str] | None:
        return visible(principal) if visible is not None else None

    @router.get("/api/v1/events")
    def events(principal: Annotated[Any, Depends(who)], job: str | None = None,
               gpu: str | None = None, since: float | None = None,
               limit: int = Query(200, ge=1, le=10000)) -> dict[str, Any]:
        seen = scope(principal)
        if seen is not None and job is not None and job not in seen:
            return {"events": []}
        if path is not None and path.exists():
            recs = read_records(path, job=job, gpu=gpu, since=since, limit=limit)
        elif observer.log is not None:
            recs = observer.log.recent(limit, job=job, gpu=gpu, since=since)
        else:
            recs = []
        if seen is not None:
            recs = [mask(r, (set(r_ids) | job_ids_in(r)) - seen) for r in recs
                    if (r_ids := mentioned_jobs(r)) and set(r_ids) & seen]
        return {"events": [dict(r, text=describe(r)) for r in recs]}

    @router.get("/api/v1/cluster")
    def cluster(principal: Annotated[Any, Depends(who)]) -> dict[str, Any]:
        recs = observer.log.recent(recent) if observer.log is not None else []
        seen = scope(principal)
        # a controller gives the page its latest jobs only (10,000 queued jobs are no page)
        snap = source.status(limit=PAGE_JOBS) if hasattr(source, "cluster") else \
            source.status()
        owners = snap.get("owners")
        counts = cluster_counts(snap)  # the cluster's, before the reader's scope
        if seen is not None:
            snap = scoped_snapshot(snap, seen)
        out = cluster_view(snap, speeds=observer.job_speeds(), decisions=recs, visible=seen)
        out["counts"] = counts
        if owners is not None:  # tenancy on: usage against entitlement (others as counts)
            out["owners"] = owner_view(owners, None if seen is None else
                                       str(getattr(principal, "id", "") or ""),
                                       str(getattr(principal, "name", "") or ""))
        return out

    return router


def instrument(app: FastAPI, observer: Observer) -> None:
    """Record every request's latency in ``miso_api_request_duration_seconds`` (labelled by
    method, route template and status). A plain ASGI middleware: Starlette's
    ``BaseHTTPMiddleware`` runs each request in a task of its own with streams between, a
    cost every submission paid on the event loop."""
    if observer.metrics is None:
        return
    app.add_middleware(_Timed, metrics=observer.metrics)


class _Timed:
    """The ASGI middleware of :func:`instrument`."""

    def __init__(self, app: Any, metrics: Any) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def sent(msg: Any) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
            await send(msg)
        try:
            await self.app(scope, receive, sent)
        finally:
            route = scope.get("route")
            self.metrics.request(scope["method"], getattr(route, "path", "unmatched"), status,
                                 time.perf_counter() - t0)


def api_routers(controller: Any, observer: Observer, listen_host: str = "127.0.0.1", *,
                metrics_public: bool = False) -> list[APIRouter]:
    """The observe routes as the API server (:mod:`miso.api`) mounts them: the JSON views for
    any user with a token (each sees their own jobs, others' as "other"; admins see all);
    ``/metrics`` for any user's token (a user sees other users' jobs as ``owner="other"``),
    or for anyone when the operator opts out (``miso cluster up --metrics-public``: every
    owner is then ``other``). ``listen_host`` is kept for callers; loopback is no exemption
    (any local account reaches it)."""
    from miso.api.auth import require_user

    del listen_host
    return [observe_router(controller, observer, auth=require_user,
                           visible=owner_scope(controller.store),
                           metrics_auth=None if metrics_public else require_user)]


def make_app(source: StatusSource, observer: Observer, **kw: Any) -> FastAPI:
    """A minimal app with only these routes (the read-only server on loopback, tests)."""
    app = FastAPI(title="miso observe", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(observe_router(source, observer, **kw))
    instrument(app, observer)
    return app
