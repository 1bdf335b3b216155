"""Inference services in the scheduling core: their spec, events and decisions.

A service is a kind of work beside a job: it has no end, it is scaled. Its replicas each hold
one MIG slice (``profile`` at ``slot`` on ``gpu``); together they must cover the service's
smoothed request rate x (1 + ``headroom``) at its latency SLO (capacities:
:func:`miso.serving.catalog.capacity_rps`). Plain frozen dataclasses, no behaviour; the
planning lives in :mod:`miso.sched.serviceplan`.

Resizes are make-before-break: the policy starts the new replica (:class:`StartReplica`), the
driver reports :class:`ReplicaReady` once the model is loaded, and only then the policy drains
the old one (:class:`DrainReplica`; the driver reports :class:`ReplicaDrained` when its
in-flight requests are done and its slice is free).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from miso.mig import Placement
from miso.sched.decisions import Decision
from miso.sched.events import Event


@dataclass(frozen=True)
class ServiceSpec:
    """An inference service: ``model`` names a :data:`miso.serving.catalog.MODELS` entry;
    ``slo_p99_ms`` is the latency bound at ``percentile`` (99 by default); ``headroom`` is the
    spare capacity kept over the smoothed rate (0.2 = cover 1.2 x the rate); ``memory_gb`` the
    replica's memory need (0: the catalogue's). ``owner`` is charged like a job's owner."""

    name: str
    owner: str
    model: str
    slo_p99_ms: float
    min_replicas: int = 1
    max_replicas: int = 16
    headroom: float = 0.2
    memory_gb: float = 0.0
    percentile: float = 99.0

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 128:
            raise ValueError("service name must be 1-128 characters")
        if self.slo_p99_ms <= 0:
            raise ValueError(f"service {self.name}: slo_p99_ms must be > 0")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"service {self.name}: need 0 <= min_replicas <= max_replicas")
        if self.headroom < 0:
            raise ValueError(f"service {self.name}: headroom must be >= 0")
        if not 0 < self.percentile < 100:
            raise ValueError(f"service {self.name}: percentile must be in (0, 100)")


# ---- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceSubmitted(Event):
    """A service was declared (it gets ``min_replicas`` replicas as soon as room allows)."""

    service: ServiceSpec


@dataclass(frozen=True)
class ServiceRateObserved(Event):
    """The request rate a service saw over the last window (req/s, from the router)."""

    name: str
    rate_rps: float


@dataclass(frozen=True)
class ReplicaReady(Event):
    """A started replica has loaded its model and takes requests."""

    service: str
    replica: str


@dataclass(frozen=True)
class ReplicaDrained(Event):
    """A draining replica finished its in-flight requests; its slice is free."""

    service: str
    replica: str


@dataclass(frozen=True)
class ServiceStopped(Event):
    """A service was withdrawn: its replicas are drained, it is forgotten."""

    name: str


@dataclass(frozen=True)
class ServiceCapacityObserved(Event):
    """A capacity measured live (req/s at the SLO) for one replica's profile: it replaces the
    catalogue's value for that service and profile."""

    service: str
    gpu_model: str
    profile: str
    capacity_rps: float


@dataclass(frozen=True)
class ServiceSlicesChanged(Event):
    """Replicas took or gave back slices of ``gpu``: what a training policy is told (by
    :class:`~miso.sched.servicepolicy.ServicesFirst`; never delivered by a driver)."""

    gpu: str


# ---- decisions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StartReplica(Decision):
    """Create the MIG instance ``slot`` (a profile at a start) on ``gpu`` and start replica
    ``replica`` of ``service`` on it; the driver answers :class:`ReplicaReady` after the
    model's load time. ``why`` explains (rate, covering, SLO), outside equality."""

    service: str
    replica: str
    gpu: str
    slot: Placement
    why: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def profile(self) -> str:
        return self.slot.profile


@dataclass(frozen=True)
class DrainReplica(Decision):
    """Stop routing new requests to ``replica``; once its in-flight requests finish, destroy
    its instance (the driver answers :class:`ReplicaDrained`)."""

    service: str
    replica: str
    why: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)


SERVICE_EVENTS = (ServiceSubmitted, ServiceRateObserved, ReplicaReady, ReplicaDrained,
                  ServiceStopped, ServiceCapacityObserved)
SERVICE_DECISIONS = (StartReplica, DrainReplica)
