"""The Ray transport: agents as named Ray actors, reached by the controller's RayTransport.

Agent actors are named ``miso-agent:<node>`` in the namespace ``miso``, the controller actor
``miso-controller`` (the names below: a running cluster finds its actors by them).
:class:`RayTransport` calls the agents and turns every failure to reach one into
:class:`~miso.nodeerrors.NodeUnavailable`. The actors themselves, and starting and
stopping them, are :mod:`miso.cluster.rayactors` and :mod:`miso.cluster.raystart`. ray is
imported only inside the methods, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from miso.nodeerrors import NodeUnavailable

NAMESPACE = "miso"
CONTROLLER = "miso-controller"
AGENT_PREFIX = "miso-agent:"
AGENT_RESOURCE = "miso_agent"


class RayTransport:
    """Agents as named Ray actors ``miso-agent:<node>`` in the ``miso`` namespace."""

    PREFIX = AGENT_PREFIX

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
