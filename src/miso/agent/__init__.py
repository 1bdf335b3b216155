"""Per-node agent: GPU layouts through a backend, jobs as real processes, progress reports."""

from miso.agent.agent import Agent
from miso.agent.attempt import RateTracker
from miso.nodewire import layout_data, placement_of

__all__ = ["Agent", "RateTracker", "layout_data", "placement_of"]
