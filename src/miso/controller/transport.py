"""How the controller reaches agents: in-process (tests, one node) or through Ray actors.

A transport lists the reachable nodes and calls an agent method by name; every failure to reach
a node is :class:`NodeUnavailable`, whatever the transport. Only this module's
:class:`RayTransport` (and :mod:`miso.raycluster`) import ray.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, Protocol

from miso.agent import Agent


class NodeUnavailable(RuntimeError):
    """The node's agent cannot be reached (it died, or its node left)."""


class Transport(Protocol):
    def nodes(self) -> list[str]: ...

    def call(self, node: str, method: str, *args: Any, timeout: float = 30.0) -> Any: ...


class LocalTransport:
    """Agents living in this process. :meth:`remove` simulates losing a node."""

    def __init__(self, agents: dict[str, Agent] | None = None) -> None:
        self._agents: dict[str, Agent] = dict(agents or {})
        self._lock = threading.Lock()
        #: Called as ``hook(node, method)`` before every call (fault injection in tests).
        self.hook: Callable[[str, str], None] | None = None

    def add(self, agent: Agent) -> None:
        with self._lock:
            self._agents[agent.node] = agent

    def remove(self, node: str, *, kill_jobs: bool = True) -> Agent | None:
        """Take a node away as if it crashed: its processes die, calls fail from now on."""
        with self._lock:
            agent = self._agents.pop(node, None)
        if agent is not None and kill_jobs:
            agent.shutdown()
        return agent

    def agents(self) -> dict[str, Agent]:
        with self._lock:
            return dict(self._agents)

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._agents)

    def call(self, node: str, method: str, *args: Any, timeout: float = 30.0) -> Any:
        with self._lock:
            agent = self._agents.get(node)
        if agent is None:
            raise NodeUnavailable(f"node {node} is gone")
        if self.hook is not None:
            self.hook(node, method)
        return getattr(agent, method)(*args)


class RayTransport:
    """Agents as named Ray actors ``miso-agent:<node>`` in the ``miso`` namespace."""

    PREFIX = "miso-agent:"

    def __init__(self, namespace: str = "miso") -> None:
        import ray  # noqa: PLC0415

        self._ray = ray
        self._ns = namespace
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()

    def nodes(self) -> list[str]:
        from ray.util import list_named_actors  # noqa: PLC0415

        names = list_named_actors(all_namespaces=True)
        out = []
        for n in names:
            name, ns = (n["name"], n["namespace"]) if isinstance(n, dict) else (n, self._ns)
            if ns == self._ns and name.startswith(self.PREFIX):
                out.append(name[len(self.PREFIX):])
        return sorted(out)

    def _handle(self, node: str) -> Any:
        with self._lock:
            h = self._handles.get(node)
        if h is None:
            try:
                h = self._ray.get_actor(self.PREFIX + node, namespace=self._ns)
            except ValueError as e:
                raise NodeUnavailable(f"node {node}: no agent actor ({e})") from e
            with self._lock:
                self._handles[node] = h
        return h

    def call(self, node: str, method: str, *args: Any, timeout: float = 30.0) -> Any:
        from ray.exceptions import (  # noqa: PLC0415
            ActorUnschedulableError,
            GetTimeoutError,
            NodeDiedError,
            RayActorError,
            RayTaskError,
        )

        h = self._handle(node)
        try:
            return self._ray.get(getattr(h, method).remote(*args), timeout=timeout)
        except ActorUnschedulableError as e:
            # a supervised agent whose node left the cluster: Ray cannot restart it (it is
            # pinned to that node), so it never answers again; end it so that its name is
            # free for the agent of a node that joins later
            with self._lock:
                self._handles.pop(node, None)
            with contextlib.suppress(Exception):
                self._ray.kill(h, no_restart=True)
            raise NodeUnavailable(f"node {node}: its node left the cluster "
                                  f"({type(e).__name__})") from e
        except (RayActorError, GetTimeoutError, NodeDiedError) as e:
            with self._lock:
                self._handles.pop(node, None)
            raise NodeUnavailable(f"node {node}: {type(e).__name__}: {e}") from e
        except RayTaskError as e:  # the agent itself says it cannot serve (it restarted)
            cause = getattr(e, "cause", None)
            if isinstance(cause, NodeUnavailable):
                raise NodeUnavailable(str(cause)) from e
            raise
