"""What every transport offers the controller: the nodes it reaches, and calls by method name.

Every failure to reach a node is :class:`NodeUnavailable`, whatever the transport.
"""

from __future__ import annotations

from typing import Any, Protocol


class NodeUnavailable(RuntimeError):
    """The node's agent cannot be reached (it died, or its node left)."""


class Transport(Protocol):
    def nodes(self) -> list[str]: ...

    def call(self, node: str, method: str, *args: Any, timeout: float = 30.0) -> Any: ...
