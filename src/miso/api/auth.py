"""Who is asking, and the shape of an answer: the bearer-token dependencies every route of
the API (and every router mounted beside it: metrics, web page, services) uses, the
``{"error": ...}`` exception and the fast JSON response."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from miso.api.users import User


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


class Json(JSONResponse):
    """A JSON answer of plain data, serialised directly (FastAPI's generic encoder costs
    milliseconds for a page of job records)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=str, separators=(",", ":")).encode()
