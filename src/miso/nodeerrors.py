"""Errors of the node protocol, below every layer that speaks it: the agent raises them, the
transport carries them, the controller handles them (docs/architecture.md, "Layers").
Standard library only."""

from __future__ import annotations


class NodeUnavailable(RuntimeError):
    """The node's agent cannot be reached (it died, or its node left), or it refuses work
    (a newer agent took its node)."""
