"""What every transport offers the controller: the nodes it reaches, and calls by method name.

Every failure to reach a node is :class:`NodeUnavailable`, whatever the transport.
"""

from __future__ import annotations

from typing import Any, Protocol

from miso.nodeerrors import NodeUnavailable

__all__ = ["NodeUnavailable", "Transport"]


class Transport(Protocol):
    def nodes(self) -> list[str]: ...

    def call(self, node: str, method: str, *args: Any, timeout: float = 30.0) -> Any: ...
