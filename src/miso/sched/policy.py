"""The Policy protocol and the speed-estimator protocol (the policy table, built by name, is
:mod:`miso.sched.policies`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from miso.mig import Geometry
from miso.sched.decisions import Decision
from miso.sched.events import Event
from miso.sched.state import ClusterState, JobState

SpeedTable = dict[str, dict[str, float]]
"""job id -> {profile name -> speed relative to the full GPU}; a missing profile = does not fit."""


@runtime_checkable
class SpeedEstimator(Protocol):
    """Where policies get per-profile speeds from (no I/O, deterministic for a seed).

    ``profile`` is the raw MPS profile of the mix the jobs were profiled in (job -> rates at
    100/50/14 %), or None when no profile is available (oracle-style estimators ignore it).
    """

    needs_profile: bool
    #: job -> profile -> std of the estimate, where the estimator knows one (explanations)
    uncertainty: dict[str, dict[str, float]]

    def estimate(self, geom: Geometry, jobs: Sequence[JobState],
                 profile: Mapping[str, tuple[float, ...]] | None = None) -> SpeedTable: ...


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: events in, decisions out.

    ``decide`` is called once per event, after the driver has updated ``state`` with it. It may
    read ``state`` freely, draw plan ids with ``state.new_plan_id()``, and keep private caches,
    but must not change ``state`` otherwise and must not do I/O.
    """

    name: str

    def decide(self, now: float, event: Event, state: ClusterState) -> list[Decision]: ...
