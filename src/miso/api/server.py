"""Serving the API from the cluster head: uvicorn in a background thread, HTTP or HTTPS.

The listen address defaults to 127.0.0.1 with a free port; a non-loopback address needs TLS
(``--tls-cert``/``--tls-key``) unless explicitly allowed insecure.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

DEFAULT_LISTEN = "127.0.0.1:0"


class ListenError(ValueError):
    """A listen address or TLS setting that cannot be used."""


@dataclass(frozen=True)
class Listen:
    """Where and how the API is served."""

    host: str = "127.0.0.1"
    port: int = 0
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_listen(text: str, *, tls_cert: str | None = None, tls_key: str | None = None,
                 insecure: bool = False) -> Listen:
    """``HOST:PORT`` (``[v6]:PORT``, or just ``PORT``) checked against the TLS rule."""
    host, sep, port_s = text.rpartition(":")
    if not sep:
        host, port_s = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_s)
    except ValueError:
        raise ListenError(f"bad listen address {text!r}: expected HOST:PORT") from None
    if not 0 <= port <= 65535:
        raise ListenError(f"bad port {port} in {text!r}")
    if (tls_cert is None) != (tls_key is None):
        raise ListenError("give both --tls-cert and --tls-key")
    if tls_cert is None and not is_loopback(host) and not insecure:
        raise ListenError(f"refusing to serve the API on {host} without TLS: give "
                          "--tls-cert/--tls-key (or --insecure to serve plain HTTP)")
    return Listen(host, port, tls_cert, tls_key)


def url_of(listen: Listen, port: int) -> str:
    host = listen.host
    if host in ("0.0.0.0", "::"):
        host = socket.getfqdn()
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if listen.tls else 'http'}://{host}:{port}"


class ApiServer:
    """An ASGI app served by uvicorn in a daemon thread (see :meth:`start`)."""

    def __init__(self, app: Any, listen: Listen) -> None:
        self.app = app
        self.listen = listen
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> str:
        """Bind, start serving, return the URL (with the actual port)."""
        import uvicorn  # noqa: PLC0415

        fam = socket.AF_INET6 if ":" in self.listen.host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.listen.host, self.listen.port))
        except OSError as e:
            sock.close()
            raise ListenError(f"cannot listen on {self.listen.host}:{self.listen.port}: "
                              f"{e.strerror or e}") from None
        sock.listen(1024)
        port = sock.getsockname()[1]
        cfg = uvicorn.Config(self.app, log_level="warning", access_log=False,
                             ssl_certfile=self.listen.tls_cert, ssl_keyfile=self.listen.tls_key,
                             timeout_keep_alive=30, backlog=1024)
        try:
            cfg.load()  # reads the TLS certificate and key now, so errors reach the caller
        except (OSError, ValueError) as e:
            sock.close()
            raise ListenError(f"cannot serve TLS with {self.listen.tls_cert}: {e}") from None
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="miso-api", daemon=True)
        self._thread.start()
        deadline = time.time() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.time() > deadline:
                raise ListenError("the API server did not start")
            time.sleep(0.02)
        self.url = url_of(self.listen, port)
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
