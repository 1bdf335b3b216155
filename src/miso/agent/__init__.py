"""Per-node agent: GPU layouts through a backend, jobs as real processes, progress reports."""

from miso.agent.agent import Agent, layout_data, placement_of
from miso.agent.attempt import RateTracker

__all__ = ["Agent", "RateTracker", "layout_data", "placement_of"]
