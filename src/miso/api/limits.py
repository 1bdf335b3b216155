"""ASGI middleware that refuses request bodies over a size limit with 413 (JSON error).

A declared ``Content-Length`` over the limit is refused before the body is read; a chunked
body is counted as it streams and cut off once it passes the limit.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException

Scope = dict[str, Any]
Message = dict[str, Any]


class BodyTooLarge(HTTPException):
    """Raised while the body streams in; the app's handlers turn it into the 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body over {max_bytes} bytes")


class BodySizeLimit:
    """Wrap an ASGI app; bodies over ``max_bytes`` get ``413 {"error": ...}``."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"error": f"request body over {self.max_bytes} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    declared = self.max_bytes + 1
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return msg

        async def tracked_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)
