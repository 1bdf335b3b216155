"""The router in a process of its own: ``python -m miso.serving.routerproc HOST PORT``.

In the controller's process the router's event loop shares one interpreter lock with the
controller loop, the API and every poller thread, and its throughput drops to a few hundred
requests/s under load; in its own process it has a CPU to itself. :class:`RouterProcess` has
the methods of :class:`~miso.serving.router.Router` the service manager calls and speaks to
the child over its stdin/stdout, one JSON line per call (the child reads only its parent; it
exits when its stdin closes, so it never outlives the controller). Its Prometheus metrics are
read at scrape time and re-exported in the controller's registry.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from miso.serving.router import PREFIX, Router, RouterServer

#: What the parent may ask the child to do (nothing else is ever called).
CALLS = ("add_service", "stop_service", "forget_service", "add_replica", "drain",
         "outstanding", "remove_replica", "replicas", "stats", "metrics")


class RouterProcess:
    """A router child process with :class:`Router`'s table methods."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, registry: Any = None) -> None:
        self.host = host
        self._lock = threading.Lock()
        self.port = port
        self._spawn(port)
        #: how many times the child was started again (:meth:`restart`)
        self.restarts = 0
        if registry is not None:
            registry.register(_RemoteMetrics(self))

    def _spawn(self, port: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "miso.serving.routerproc",
                                      self.host, str(port)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        hello = json.loads(self._readline())
        if "error" in hello:
            self.proc.wait(5)
            raise OSError(hello["error"])
        self.port = int(hello["port"])

    def alive(self) -> bool:
        """Whether the child runs (a killed or crashed router does not)."""
        return self.proc.poll() is None

    def exit_status(self) -> int | None:
        return self.proc.poll()

    def restart(self, attempts: int = 10, pause_s: float = 0.2) -> None:
        """A new child on the same port, so every service URL stays the same (raises
        OSError when the port stays taken). Its table is empty: the caller adds the
        services and replicas again (:meth:`miso.controller.services.ServiceManager.tick`)."""
        with self._lock:
            self.stop()
            for i in range(attempts):
                try:
                    self._spawn(self.port)
                    break
                except OSError:
                    if i == attempts - 1:
                        raise
                    time.sleep(pause_s)
            self.restarts += 1

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise OSError("the router process ended")
        return line

    def _call(self, method: str, *args: Any) -> Any:
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(json.dumps([method, list(args)]) + "\n")
            self.proc.stdin.flush()
            out = json.loads(self._readline())
        if "error" in out:
            raise RuntimeError(f"router: {out['error']}")
        return out.get("result")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def service_url(self, name: str) -> str:
        return f"{self.url}{PREFIX}{name}"

    @property
    def router(self) -> RouterProcess:  # the manager reads ``server.router``
        return self

    def add_service(self, name: str, slo_ms: float | None = None) -> None:
        self._call("add_service", name, slo_ms)

    def stop_service(self, name: str) -> None:
        self._call("stop_service", name)

    def forget_service(self, name: str) -> None:
        self._call("forget_service", name)

    def add_replica(self, service: str, replica_id: str, host: str, port: int,
                    profile: str = "") -> None:
        self._call("add_replica", service, replica_id, host, port, profile)

    def drain(self, service: str, replica_id: str) -> None:
        self._call("drain", service, replica_id)

    def outstanding(self, service: str, replica_id: str) -> int:
        return int(self._call("outstanding", service, replica_id))

    def remove_replica(self, service: str, replica_id: str) -> None:
        self._call("remove_replica", service, replica_id)

    def replicas(self, service: str) -> list[dict[str, Any]]:
        return list(self._call("replicas", service))

    def stats(self, service: str, window_s: float = 60.0) -> dict[str, Any]:
        return dict(self._call("stats", service, window_s))

    def metrics_text(self) -> str:
        return str(self._call("metrics"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):  # it may end between poll and close
                    self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


class _RemoteMetrics:
    """The child's metrics, read at scrape time."""

    def __init__(self, rp: RouterProcess) -> None:
        self.rp = rp

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        try:
            text = self.rp.metrics_text()
        except (OSError, RuntimeError, ValueError):
            return []
        return list(text_string_to_metric_families(text))


def main(argv: list[str] | None = None) -> int:
    from prometheus_client import generate_latest  # noqa: PLC0415

    args = sys.argv[1:] if argv is None else argv
    host, port = args[0], int(args[1])
    try:
        srv = RouterServer(Router(), host, port).start()
    except OSError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    print(json.dumps({"port": srv.port}), flush=True)
    router = srv.router
    for line in sys.stdin:
        try:
            method, params = json.loads(line)
            if method not in CALLS or not isinstance(params, list):
                raise ValueError(f"unknown call {method!r}")
            if method == "metrics":
                result: Any = generate_latest(router.registry).decode()
            else:
                result = getattr(router, method)(*params)
            if method in ("add_service",):
                result = None  # a Route object: the parent needs nothing back
            out = {"result": result}
        except Exception as e:  # noqa: BLE001 - reported to the parent, the router goes on
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out, default=str), flush=True)
    srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
