"""Fake node agents (:class:`miso.agent.fakeagent.FakeAgent`) as Ray actors, named like the
real agents (``miso-agent:<node>``, namespace ``miso``) so :class:`RayTransport` and the
controller find and drive them unchanged: many of them on one Ray node for scale tests."""

from __future__ import annotations

from typing import Any

from miso.agent.fakeagent import FakeAgent
from miso.agent.incarnation import Incarnation
from miso.cluster.rayactors import AgentActor
from miso.transport.ray import AGENT_PREFIX, NAMESPACE


class FakeAgentActor(AgentActor):
    """The agent actor's methods over a fake agent (with an incarnation, as the real one)."""

    def __init__(self, node: str, gpus: int = 8, model: str = "A100-40GB") -> None:  # noqa: D107
        self.agent = Incarnation(FakeAgent(node, gpus, model))  # type: ignore[arg-type]


def start_fake_actors(nodes: int, gpus: int = 8, *, prefix: str = "fake",
                      model: str = "A100-40GB") -> list[Any]:
    """Start ``nodes`` fake agent actors (``<prefix>0`` ...) on the connected Ray cluster,
    using no CPU each; returns their handles (they live until killed)."""
    import ray  # noqa: PLC0415

    actor = ray.remote(num_cpus=0)(FakeAgentActor)
    return [actor.options(name=f"{AGENT_PREFIX}{prefix}{i}", namespace=NAMESPACE)
            .remote(f"{prefix}{i}", gpus, model) for i in range(nodes)]
