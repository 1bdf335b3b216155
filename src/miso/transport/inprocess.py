"""The in-process transport: agents living in this process (no Ray).

The one-process emulated cluster built on it (agents over emulated GPUs + a controller) is
:class:`miso.cluster.local.LocalCluster`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from miso.agent import Agent
from miso.nodeerrors import NodeUnavailable


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
