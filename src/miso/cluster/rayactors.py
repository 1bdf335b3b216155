"""miso's Ray actors, the composition roots of a Ray cluster: the agent actor
(``miso-agent:<node>``, namespace ``miso``) wraps :class:`miso.agent.Agent` (same method
names, plain data) over a GPU backend; the controller actor (``miso-controller``) runs the
controller with a :class:`~miso.transport.ray.RayTransport`, the observer and the HTTP API
beside it. The names and namespace live with the transport (:mod:`miso.transport.ray`), which
finds the agents by them.

Starting and stopping these actors is :mod:`miso.cluster.raystart`. ray is imported only
inside the methods, so importing this module is cheap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from miso.transport.ray import NAMESPACE, RayTransport


class AgentActor:
    """Ray actor around :class:`miso.agent.Agent` (same method names, plain data)."""

    def __init__(self, node: str, backend: dict[str, Any], workdir: str,
                 rate_window: float = 1.0, change_threshold: float = 0.25) -> None:
        from miso.agent import Agent  # noqa: PLC0415
        from miso.agent.incarnation import Incarnation  # noqa: PLC0415
        from miso.cluster.rayletenv import refuse_unless_children_kept  # noqa: PLC0415

        refuse_unless_children_kept()  # or a crash may leave jobs running twice (issue 26)
        os.umask(0o077)  # private state: job logs and directories of this node
        #: this life of the agent (a new one after every restart by Ray)
        self.agent = Incarnation(Agent(node, make_backend(backend, node), workdir,
                                       rate_window=rate_window,
                                       change_threshold=change_threshold))

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> str:
        return self.agent.ping()

    def free_port(self) -> int:
        return self.agent.free_port()

    def describe(self) -> dict[str, Any]:
        d = self.agent.describe()
        if d.get("addr") is None:  # a gang's rendezvous host: this Ray node's IP
            from ray.util import get_node_ip_address  # noqa: PLC0415

            d["addr"] = get_node_ip_address()
        return d

    def apply_layout(self, gpu: int, layout: list[Any]) -> dict[str, Any]:
        return self.agent.apply_layout(gpu, layout)

    def read_layout(self, gpu: int) -> list[list[Any]]:
        return self.agent.read_layout(gpu)

    def start_mps(self, gpu: int, placement: Any) -> str:
        return self.agent.start_mps(gpu, placement)

    def stop_mps(self, gpu: int) -> None:
        self.agent.stop_mps(gpu)

    def launch(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.agent.launch(spec)

    def checkpoint(self, job: str, attempt: int) -> bool:
        return self.agent.checkpoint(job, attempt)

    def kill(self, job: str, attempt: int) -> bool:
        return self.agent.kill(job, attempt)

    def forget(self, job: str, attempt: int) -> None:
        self.agent.forget(job, attempt)

    def report(self, lease_until: float | None = None) -> dict[str, Any]:
        return self.agent.report(lease_until)

    def logs(self, job: str, tail: int = 200) -> str:
        return self.agent.logs(job, tail)

    def running_pids(self) -> list[int]:
        return self.agent.running_pids()

    def shutdown(self) -> None:
        self.agent.shutdown(destroy_instances=True)


class ControllerActor:
    """Ray actor around :class:`miso.controller.Controller` with a :class:`RayTransport`."""

    def __init__(self, state_dir: str, config: dict[str, Any],
                 api: dict[str, Any] | None = None) -> None:
        import logging  # noqa: PLC0415

        from miso.controller import Controller, ControllerConfig  # noqa: PLC0415
        from miso.controller.statelock import StateDirLocked  # noqa: PLC0415
        from miso.controller.store import StoreError  # noqa: PLC0415
        from miso.controller.storefile import open_store  # noqa: PLC0415

        logging.basicConfig(level=logging.INFO)
        os.umask(0o077)  # private state: files 0600, directories 0700
        d = Path(state_dir)
        d.mkdir(parents=True, exist_ok=True)
        #: Why this controller could not start ("" when it runs); ``ping`` reports it.
        self.error = ""
        try:
            store = open_store(d)
        except StoreError as e:
            self.error = str(e)
            return
        self.ctl = Controller(store, RayTransport(NAMESPACE), ControllerConfig(**config),
                              checkpoint_root=d / "checkpoints")
        from miso.observe import attach  # noqa: PLC0415

        self.obs = attach(self.ctl, d)  # metrics and the decision log (docs/observe.md)
        try:
            self.ctl.start()
        except StateDirLocked as e:
            self.error = str(e)
            return
        self.api = None
        # inference services: the router on the head and the replicas' manager (issue 29)
        from miso.controller.services import attach_services  # noqa: PLC0415

        self.services = attach_services(self.ctl, d, self.obs,
                                        (api or {}).get("host", "127.0.0.1"))
        if api is not None:  # the HTTP API (miso.api), in this process beside the controller
            from miso.api.head import serve  # noqa: PLC0415
            from miso.api.server import ListenError  # noqa: PLC0415
            from miso.api.services import services_router  # noqa: PLC0415
            from miso.observe.routes import api_routers, instrument  # noqa: PLC0415

            listen = {k: v for k, v in api.items() if k != "metrics_public"}
            try:
                self.api = serve(self.ctl, d, listen, extra_routers=api_routers(
                    self.ctl, self.obs, listen.get("host", "127.0.0.1"),
                    metrics_public=bool(api.get("metrics_public")))
                    + [services_router(self.services)],
                    setup=lambda app: instrument(app, self.obs))
            except ListenError as e:  # e.g. the --listen port is taken: ping reports it
                self.error = f"the API cannot start: {e}"
                self.ctl.stop()

    def api_url(self) -> str | None:
        return self.api.url if getattr(self, "api", None) is not None else None

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> str:
        """``"ok"``, or the one-line reason this controller did not start."""
        return self.error or "ok"

    def submit(self, command: list[str], name: str | None = None,
               memory_gb: float | None = None, workload: str | None = None,
               env: dict[str, str] | None = None, cwd: str | None = None,
               request_id: str | None = None) -> dict[str, Any]:
        """``{"ok": True, "id": ...}`` or ``{"ok": False, "error": ...}`` (no exceptions).
        A retry with the same ``request_id`` returns the job of the first call."""
        from miso.controller import SubmitError  # noqa: PLC0415

        if self.error:
            return {"ok": False, "error": self.error}
        try:
            return {"ok": True, "id": self.ctl.submit(command, name=name, memory_gb=memory_gb,
                                                      workload=workload, env=env, cwd=cwd,
                                                      request_id=request_id)}
        except SubmitError as e:
            return {"ok": False, "error": str(e)}

    def cancel(self, job: str) -> dict[str, Any]:
        from miso.controller import StoreError, SubmitError  # noqa: PLC0415

        try:
            return {"ok": True, "job": self.ctl.cancel(job)}
        except (SubmitError, StoreError) as e:
            return {"ok": False, "error": str(e)}

    def status(self) -> dict[str, Any]:
        return self.ctl.status()

    def attempts(self) -> list[dict[str, Any]]:
        return self.ctl.store.attempts()

    def layouts(self) -> list[dict[str, Any]]:
        return self.ctl.store.layouts()

    def logs(self, job: str, tail: int = 200) -> dict[str, Any]:
        from miso.controller import StoreError  # noqa: PLC0415

        try:
            return {"ok": True, "text": self.ctl.logs(job, tail)}
        except StoreError as e:
            return {"ok": False, "error": str(e)}

    def halt(self) -> None:
        """Stop scheduling and leave the jobs running (:func:`checkpoint_jobs` saves them)."""
        ctl = getattr(self, "ctl", None)
        if ctl is not None:
            ctl.stop(stop_jobs=False)

    def shutdown(self) -> None:
        """Stop the controller and every job on every node."""
        ctl = getattr(self, "ctl", None)
        if ctl is not None:
            ctl.stop(stop_jobs=True)


def make_backend(spec: dict[str, Any], node: str) -> Any:
    """Build a GPU backend from ``{"kind": "emulated"|"nvml", ...}``."""
    kind = spec.get("kind", "emulated")
    if kind == "emulated":
        from miso.backend import EmulatedBackend  # noqa: PLC0415

        return EmulatedBackend(int(spec.get("gpus", 1)), spec.get("model", "A100-40GB"),
                               node=node)
    if kind == "nvml":
        from miso.backend.nvml import NvmlBackend  # noqa: PLC0415

        return NvmlBackend(model=spec.get("model"))
    raise ValueError(f"unknown backend kind {kind!r}")
