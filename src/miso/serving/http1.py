"""HTTP/1.1 on asyncio streams, as the service router and the emulated server speak it.

Requests are hostile input: the head (:data:`MAX_HEAD`), the number of headers
(:data:`MAX_HEADERS`) and the body (:data:`MAX_BODY`, with a ``Content-Length``) are bounded; a
chunked request body is refused (``411``). A replica's response may be chunked: it is re-framed
with a ``Content-Length``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
MAX_HEADERS = 100
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade", b"content-length"})
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 411: "Length Required",
           413: "Payload Too Large", 431: "Request Header Fields Too Large",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_response(status: int, payload: dict[str, Any], keep_alive: bool) -> bytes:
    """A whole HTTP/1.1 response with a JSON body."""
    body = json.dumps(payload).encode()
    return (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n").encode() + body


def _parse_headers(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    if len(lines) > MAX_HEADERS:
        raise BadRequest(431, "too many headers")
    out = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, "malformed header")
        out.append((name, value.strip()))
    return out


def _content_length(headers: list[tuple[bytes, bytes]]) -> int:
    n = 0
    for k, v in headers:
        if k.lower() == b"content-length":
            if not v.isdigit():
                raise BadRequest(400, "bad Content-Length")
            n = int(v)
    return n


@dataclass
class RawRequest:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool


async def read_http_request(reader: asyncio.StreamReader) -> RawRequest | None:
    """The next HTTP/1.x request on a connection (None at a clean end of the connection);
    :class:`BadRequest` for what is malformed or over the bounds."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial.strip():
            raise BadRequest(400, "incomplete request") from None
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest(431, "request head too large") from None
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    headers = _parse_headers(lines[1:])
    if any(k.lower() == b"transfer-encoding" for k, _ in headers):
        raise BadRequest(411, "send a Content-Length (chunked bodies are not accepted)")
    n = _content_length(headers)
    if n > MAX_BODY:
        raise BadRequest(413, f"body over {MAX_BODY} bytes")
    conn = next((v.lower() for k, v in headers if k.lower() == b"connection"), b"")
    keep = conn != b"close" if version == b"HTTP/1.1" else conn == b"keep-alive"
    body = await reader.readexactly(n) if n else b""
    return RawRequest(method, target, headers, body, keep)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes, bool]:
    """(status, the head to send the client without its Connection line and final CRLF,
    the body, whether the connection can be reused)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    status = int(status_line[1])
    headers = _parse_headers(lines[1:])
    chunked = any(k.lower() == b"transfer-encoding" and b"chunked" in v.lower()
                  for k, v in headers)
    conn = next((v.lower() for k, v in headers if k.lower() == b"connection"), b"")
    reusable = conn != b"close" and status_line[0] == b"HTTP/1.1"
    if chunked:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers kept
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    elif any(k.lower() == b"content-length" for k, _ in headers):
        body = await reader.readexactly(_content_length(headers))
    elif status in (204, 304) or 100 <= status < 200:
        body = b""
    else:
        body = await reader.read(MAX_BODY)
        reusable = False
    keep = [k + b": " + v for k, v in headers if k.lower() not in HOP_BY_HOP]
    out = (lines[0] + b"\r\n" + b"".join(h + b"\r\n" for h in keep)
           + b"Content-Length: " + str(len(body)).encode() + b"\r\n")
    return status, out, body, reusable
