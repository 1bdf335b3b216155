"""RayTransport turns every way a Ray agent can be gone into NodeUnavailable, so the poller
loses the node: a supervised agent pinned to a node that left the cluster is unschedulable
forever (`ActorUnschedulableError`, not a `RayActorError`), and its name is freed."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
from ray.exceptions import ActorUnschedulableError, GetTimeoutError  # noqa: E402

from miso.transport.ray import NodeUnavailable, RayTransport  # noqa: E402


class _Method:
    def remote(self, *args: object) -> str:
        return "ref"


class _Handle:
    report = _Method()


class _FakeRay:
    """Only what RayTransport.call uses of the ``ray`` module."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.killed: list[object] = []

    def get(self, ref: object, timeout: float) -> object:
        raise self.error

    def kill(self, handle: object, no_restart: bool = False) -> None:
        self.killed.append((handle, no_restart))


def _transport(error: Exception) -> tuple[RayTransport, _FakeRay, _Handle]:
    t = RayTransport()
    fake, h = _FakeRay(error), _Handle()
    t._ray = fake  # noqa: SLF001 - the test's stand-in for the ray module
    t._handles["worker"] = h  # noqa: SLF001
    return t, fake, h


def test_an_agent_whose_node_left_is_unavailable_and_ended() -> None:
    t, fake, h = _transport(ActorUnschedulableError("node gone"))
    with pytest.raises(NodeUnavailable, match="left the cluster"):
        t.call("worker", "report")
    assert fake.killed == [(h, True)]
    assert "worker" not in t._handles  # noqa: SLF001 - looked up afresh next time


def test_a_timeout_is_unavailable() -> None:
    t, fake, _ = _transport(GetTimeoutError("slow"))
    with pytest.raises(NodeUnavailable):
        t.call("worker", "report")
    assert fake.killed == []
