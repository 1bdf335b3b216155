"""Per-node agent: GPU layouts through a backend, jobs as real processes, progress reports."""

from miso.agent.agent import Agent, RateTracker, layout_data, placement_of

__all__ = ["Agent", "RateTracker", "layout_data", "placement_of"]
