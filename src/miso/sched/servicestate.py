"""Inference services in :class:`~miso.sched.state.ClusterState`: the declared services and
their replicas, the slices those hold, and the contract of the service decisions.

A replica holds one MIG instance (``slot``) on a GPU. While it does, the GPU's geometry as
training sees it (``GpuState.geom``) is the base geometry with that instance reserved
(:func:`miso.mig.beside`): every training layout a policy plans there is valid together with
the replicas, so training packs the slices a replica leaves free. ``GpuState.base`` keeps the
whole GPU's geometry. Both drivers keep this book through the same ``observe`` / ``apply``
calls as the jobs, so the simulator and the live controller see replicas as the same state.

The contract of :class:`~miso.sched.services.StartReplica`: the service is declared and not
stopped, the replica id is new, the GPU is in the policies' view with no plan in flight and no
MPS jobs, and the slot is valid beside the GPU's other replicas and the instances its running
jobs hold (a policy first requeues the jobs a replica displaces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from miso.mig import Geometry, Placement, beside, violations
from miso.sched.services import (
    DrainReplica,
    ReplicaDrained,
    ReplicaReady,
    ServiceRateObserved,
    ServiceSpec,
    ServiceStopped,
    ServiceSubmitted,
    StartReplica,
)

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.state import ClusterState, GpuState


@dataclass
class ReplicaSlot:
    """One replica as the core knows it."""

    id: str
    service: str
    owner: str
    gpu: str
    slot: Placement
    started_at: float
    ready: bool = False
    draining: bool = False


def overlaps(geom: Geometry, a: Placement, b: Placement) -> bool:
    """Two instances of ``geom``'s GPU model share a placement unit."""
    sa, sb = geom.model.profile(a.profile).size, geom.model.profile(b.profile).size
    return a.start < b.start + sb and b.start < a.start + sa


class ServiceBook:
    """Services and replicas of one :class:`~miso.sched.state.ClusterState`."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.specs: dict[str, ServiceSpec] = {}
        self.stopped: set[str] = set()
        self.replicas: dict[str, ReplicaSlot] = {}
        self.by_gpu: dict[str, dict[str, ReplicaSlot]] = {}

    # -- views ------------------------------------------------------------------------------
    def on_gpu(self, g: str) -> list[ReplicaSlot]:
        """The replicas holding slices of ``g`` (draining ones too)."""
        return list(self.by_gpu.get(g, {}).values())

    def slots(self, g: str) -> list[Placement]:
        return [r.slot for r in self.by_gpu.get(g, {}).values()]

    def stale(self, ev: object) -> bool:
        """A service event that means nothing to the book (an unknown service or replica)."""
        match ev:
            case ReplicaReady(replica=r) | ReplicaDrained(replica=r):
                return r not in self.replicas
            case ServiceRateObserved(name=n) | ServiceStopped(name=n):
                return n not in self.specs or n in self.stopped
        return False

    # -- events -----------------------------------------------------------------------------
    def observe(self, now: float, ev: object) -> None:
        match ev:
            case ServiceSubmitted(service=spec):
                if spec.name in self.specs and spec.name not in self.stopped:
                    return  # a running service declared again: ignored (the planner's rule)
                self.specs[spec.name] = spec
                self.stopped.discard(spec.name)
                ten = self.state.tenancy
                if ten is not None:
                    ten.note_owner(spec.owner)
            case ServiceStopped(name=n):
                self.stopped.add(n)
            case ReplicaReady(replica=rid):
                r = self.replicas.get(rid)
                if r is not None:
                    r.ready = True
            case ReplicaDrained(replica=rid):
                r = self.replicas.pop(rid, None)
                if r is not None:
                    self.by_gpu.get(r.gpu, {}).pop(rid, None)
                    self._reshape(r.gpu)

    def gpu_removed(self, g: str) -> list[ReplicaSlot]:
        """``g`` left the cluster: its replicas are gone (returned)."""
        lost = list(self.by_gpu.pop(g, {}).values())
        for r in lost:
            self.replicas.pop(r.id, None)
        return lost

    # -- decisions --------------------------------------------------------------------------
    def apply(self, now: float, d: StartReplica | DrainReplica) -> None:
        from miso.sched.state import ContractError

        if isinstance(d, DrainReplica):
            r = self.replicas.get(d.replica)
            if r is None or r.service != d.service:
                raise ContractError(f"DrainReplica {d.replica}: no such replica of {d.service}")
            if r.draining:
                raise ContractError(f"DrainReplica {d.replica}: already draining")
            r.draining = True
            return
        spec = self.specs.get(d.service)
        if spec is None or d.service in self.stopped:
            raise ContractError(f"StartReplica {d.replica}: service {d.service} is not running")
        if d.replica in self.replicas:
            raise ContractError(f"StartReplica {d.replica}: replica id already in use")
        gs = self.state.gpus.get(d.gpu)
        if gs is None:
            raise ContractError(f"StartReplica {d.replica}: unknown GPU {d.gpu} (or held for "
                                f"a whole-GPU run)")
        if gs.pending is not None:
            raise ContractError(f"StartReplica {d.replica} on {d.gpu}: a plan is in flight")
        if gs.mps_shares:
            raise ContractError(f"StartReplica {d.replica} on {d.gpu}: jobs run under MPS")
        held = [pl for j, pl in gs.assignment.items() if j in gs.jobs]
        probs = violations(gs.geom, [*held, d.slot])
        if probs:
            raise ContractError(f"StartReplica {d.replica} on {d.gpu}: {d.slot} does not fit "
                                f"beside its replicas and running jobs: " + "; ".join(probs))
        r = ReplicaSlot(d.replica, d.service, spec.owner, d.gpu, d.slot, now)
        self.replicas[d.replica] = r
        self.by_gpu.setdefault(d.gpu, {})[d.replica] = r
        self._reshape(d.gpu)

    def _reshape(self, g: str) -> None:
        """``g``'s geometry as training sees it: its base with the replicas' slots reserved;
        instances of the applied layout that no longer fit are dropped (destroyed)."""
        gs: GpuState | None = self.state.gpus.get(g)
        if gs is None:
            return
        base = gs.base or gs.geom
        slots = self.slots(g)
        gs.geom = beside(base, slots)
        gs.base = base if slots else None
        used = {pl for j, pl in gs.assignment.items() if j in gs.jobs}
        keep = [pl for pl in gs.layout if pl in used or not violations(gs.geom, [*used, pl])]
        if violations(gs.geom, keep):
            keep = sorted(used)
        gs.layout = tuple(sorted(keep))
        self.state.notify(g)
