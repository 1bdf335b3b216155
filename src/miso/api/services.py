"""The API routes of inference services (``miso serve``, ``miso services``).

* ``POST /api/v1/services``: start one (the caller owns it; its replicas run as the caller's
  Unix account like its jobs);
* ``GET /api/v1/services``: ``{"services": [...], "others": {...}}``: an admin sees every
  service; a user sees their own, and other owners' only as counts (issue 15's rule);
* ``GET /api/v1/services/NAME``; ``DELETE /api/v1/services/NAME``: stop it (drain, remove);
  the owner or an admin.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, field_validator

from miso.api.auth import UserDep
from miso.api.wire import API
from miso.controller.services import ServiceError, ServiceManager
from miso.controller.servicestore import ServiceRecord


class ServeRequest(BaseModel):
    name: str = Field(max_length=63)
    model: str = Field(max_length=64)
    slo_p99_ms: float
    command: list[Annotated[str, Field(max_length=4096)]] = Field(min_length=1, max_length=256)
    min_replicas: int = 1
    max_replicas: int = 8
    headroom: float = Field(default=0.2, ge=0.0, le=10.0)
    memory_gb: float | None = Field(default=None, gt=0)
    percentile: float = Field(default=99.0, gt=0, lt=100)
    env: dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=4096)]] \
        = Field(default_factory=dict, max_length=64)
    cwd: str | None = Field(default=None, max_length=4096)

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or "\x00" in v):
            raise ValueError("cwd must be an absolute path")
        return v


def _err(e: ServiceError) -> JSONResponse:
    return JSONResponse({"error": str(e)}, status_code=e.status)


def services_router(manager: ServiceManager) -> APIRouter:
    r = APIRouter(prefix=API)

    def mine(user: Any, view: dict[str, Any]) -> bool:
        rec = manager.get(view["name"])
        return bool(user.admin or (rec is not None and rec.owner == user.id))

    @r.post("/services", status_code=201)
    def serve(body: ServeRequest, user: UserDep) -> Any:
        rec = ServiceRecord(name=body.name, model=body.model, slo_p99_ms=body.slo_p99_ms,
                            command=list(body.command), owner=user.id, owner_name=user.name,
                            unix_user=user.unix_user, min_replicas=body.min_replicas,
                            max_replicas=body.max_replicas, headroom=body.headroom,
                            memory_gb=body.memory_gb, percentile=body.percentile,
                            env=dict(body.env), cwd=body.cwd)
        try:
            return JSONResponse(manager.serve(rec), status_code=201)
        except ServiceError as e:
            return _err(e)

    @r.get("/services")
    def services(user: UserDep) -> dict[str, Any]:
        views = [v for v in manager.views() if v["state"] == "running"]
        own = [v for v in views if mine(user, v)]
        others = [v for v in views if not mine(user, v)]
        return {"services": own,
                "others": {"services": len(others),
                           "replicas": sum(len(v["replicas"]) for v in others)}}

    @r.get("/services/{name}")
    def service(name: str, user: UserDep) -> Any:
        if manager.get(name) is None or not mine(user, manager.view(name)):
            return JSONResponse({"error": f"no service {name!r}"}, status_code=404)
        return manager.view(name)

    @r.delete("/services/{name}")
    def stop(name: str, user: UserDep) -> Any:
        if manager.get(name) is None or not mine(user, manager.view(name)):
            return JSONResponse({"error": f"no service {name!r}"}, status_code=404)
        try:
            return manager.stop(name)
        except ServiceError as e:
            return _err(e)

    return r
