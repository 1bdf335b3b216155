"""One life of an agent: what lets the controller tell an agent that came back from the one it
knew.

A supervised agent (the Ray agent actor, restarted by Ray after a crash or a SIGKILL) starts
empty: the guards of its predecessor's jobs killed them when it died, and its GPUs hold no
instance. :class:`Incarnation` wraps an :class:`~miso.agent.Agent` so that

* ``describe`` and ``report`` carry ``incarnation``, an id new at every start: the controller
  (:mod:`miso.controller.poller`) fences a node whose incarnation changed and requeues its jobs;
* until the controller has taken this life on (its ``describe``, called when a node joins),
  every call that starts something (``launch``, ``apply_layout``, ``start_mps``) is refused as
  :class:`~miso.nodeerrors.NodeUnavailable`: a launch meant for the old agent, sent in
  the moment before the controller noticed, must not fail the job on an agent with no layout.
"""

from __future__ import annotations

import os
import time
from typing import Any

from miso.agent.agent import Agent


class Incarnation:
    """An agent and the id of this life of it (see the module docstring)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.node = agent.node
        self.incarnation = f"{os.getpid()}-{time.time_ns()}"
        self.adopted = False

    def _starting(self, what: str) -> None:
        if not self.adopted:
            from miso.nodeerrors import NodeUnavailable  # noqa: PLC0415

            raise NodeUnavailable(f"node {self.node}: its agent restarted ({self.incarnation}) "
                                  f"and has not joined again yet; {what} refused")

    def describe(self) -> dict[str, Any]:
        self.adopted = True
        return {**self.agent.describe(), "incarnation": self.incarnation}

    def report(self, lease_until: float | None = None) -> dict[str, Any]:
        return {**self.agent.report(lease_until), "incarnation": self.incarnation}

    def launch(self, spec: dict[str, Any]) -> dict[str, Any]:
        self._starting(f"launch of {spec.get('job')}")
        return self.agent.launch(spec)

    def apply_layout(self, gpu: int, layout: list[Any]) -> dict[str, Any]:
        self._starting("a layout")
        return self.agent.apply_layout(gpu, layout)

    def start_mps(self, gpu: int, placement: Any) -> str:
        self._starting("MPS")
        return self.agent.start_mps(gpu, placement)

    def __getattr__(self, name: str) -> Any:  # every other method: the agent's own
        return getattr(self.agent, name)
