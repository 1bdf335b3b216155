"""Services first, training beside: one policy for inference services and training jobs.

:class:`ServicesFirst` wraps a training policy (a MIG policy: ``miso+``, ``miso``,
``oracle``) and a :class:`~miso.sched.serviceplan.ServicePlanner`. Service events go to the
planner, everything else to the training policy; both read and change the one
:class:`~miso.sched.state.ClusterState` through the one :class:`~miso.sched.driver.DriverStep`,
so the simulator and the live controller see replicas as the same state.

* **Replicas first**: the planner covers every service's rate at its SLO; a replica takes its
  slice from the free slices of a GPU or, when it must, from training: the jobs whose
  instances it overlaps are checkpointed (``RequeueJob``) just before its ``StartReplica``.
* **Which GPU** (the restart economy): the planner's slot price is the training a slot
  displaces (per displaced job one restart, plus its share of the GPU; a job that cannot
  checkpoint costs far more: it would lose all its progress), so a replica goes
  where it stops the least training; GPUs with a plan in flight or jobs under MPS are not
  offered.
* **Training beside**: a GPU hosting replicas shows training only its free slices
  (:mod:`miso.sched.servicestate`); when replicas take or give back slices the training
  policy is told (:class:`~miso.sched.services.ServiceSlicesChanged`: it re-plans the GPU
  and places its queue), at once for a drained replica, through a ``WakeUp`` for a started
  one (its slice is taken only once the decision is applied).
"""

from __future__ import annotations

from collections.abc import Sequence

from miso.mig import Placement, is_valid
from miso.sched.decisions import Decision, RequeueCause, RequeueJob, WakeUp
from miso.sched.events import Event, GpuAdded, GpuRemoved, Tick
from miso.sched.policy import Policy
from miso.sched.serviceplan import (
    CapacityFn,
    PlannerConfig,
    ServicePlanner,
    catalogue_capacity,
)
from miso.sched.services import (
    SERVICE_EVENTS,
    ReplicaDrained,
    ServiceSlicesChanged,
    StartReplica,
)
from miso.sched.servicestate import overlaps
from miso.sched.state import ClusterState

#: the extra price of stopping a job that cannot checkpoint (it restarts from scratch): a
#: replica stops one only where every slot stops as much
NO_CHECKPOINT_COST = 10.0

#: the tag of the ``Tick`` that tells the training policy a replica took slices of a GPU
SLICES_TAG = "services:slices"


def displaced(state: ClusterState, gpu: str, slot: Placement,
              also: Sequence[Placement] = ()) -> list[str]:
    """The jobs of ``gpu`` a replica on ``slot`` stops (beside replicas ``also`` decided in
    the same step): those whose instance overlaps one, or every job with an instance when
    the rest would not fit beside them."""
    gs = state.gpus[gpu]
    base = gs.base or gs.geom
    new = [*also, slot]
    inst = {j: pl for j, pl in gs.assignment.items() if j in gs.jobs}
    over = [j for j, pl in inst.items() if any(overlaps(base, pl, s) for s in new)]
    keep = [pl for j, pl in inst.items() if j not in over]
    if not is_valid(gs.geom, [*keep, *new]):
        return sorted(inst)
    return over


class ServicesFirst:
    """A training policy with inference services planned first (see the module docstring).
    ``planner`` is exposed (the live controller reads its services' states)."""

    def __init__(self, training: Policy, config: PlannerConfig | None = None,
                 capacity: CapacityFn = catalogue_capacity) -> None:
        self.training = training
        self.name = training.name
        self.planner = ServicePlanner({}, config, capacity)
        self._state: ClusterState | None = None
        self.planner.slot_cost = self.slot_cost

    # -- the price of a slot ----------------------------------------------------------------
    def slot_cost(self, gpu: str, slot: Placement) -> float:
        """Training a replica on ``slot`` of ``gpu`` stops: one restart per displaced job plus
        its instance's share of the GPU (so a larger, longer-lived instance costs more)."""
        st = self._state
        if st is None or gpu not in st.gpus:
            return 0.0
        gs = st.gpus[gpu]
        base = gs.base or gs.geom
        full = base.model.full_profile().compute_slices
        cost = 0.0
        for j in displaced(st, gpu, slot):
            pl = gs.assignment[j]
            cost += 1.0 + base.model.profile(pl.profile).compute_slices / full
            if not st.jobs[j].spec.checkpointable:
                cost += NO_CHECKPOINT_COST  # it loses all its progress
        return cost

    def _blocked(self, st: ClusterState) -> set[str]:
        """GPUs a replica may not take now: gone from the policies' view (held for a gang),
        a plan in flight, jobs under MPS."""
        return {g for g in self.planner.gpus
                if g not in st.gpus or st.gpus[g].pending is not None or st.gpus[g].mps_shares}

    # -- decide -----------------------------------------------------------------------------
    def decide(self, now: float, event: Event, state: ClusterState) -> list[Decision]:
        self._state = state
        match event:
            case GpuAdded(gpu=g, model=m):
                self.planner.add_gpu(g, m)
                return self.training.decide(now, event, state)
            case GpuRemoved(gpu=g):
                lost = self.planner.remove_gpu(g)
                out = self.training.decide(now, event, state)
                self.planner.blocked = self._blocked(state)
                for svc in sorted({s for s, _ in lost}):
                    out += self._with_room(now, state, self.planner.replan(now, svc, "gpu_lost"))
                return out
            case Tick(tag=tag) if tag.startswith(SLICES_TAG + ":"):
                g = tag.split(":", 2)[2]
                if g not in state.gpus:
                    return []
                return self.training.decide(now, ServiceSlicesChanged(g), state)
        if not isinstance(event, SERVICE_EVENTS):
            return self.training.decide(now, event, state)
        self.planner.blocked = self._blocked(state)
        freed = None
        if isinstance(event, ReplicaDrained):
            s = self.planner.services.get(event.service)
            r = s.replicas.get(event.replica) if s is not None else None
            freed = r.gpu if r is not None else None
        out = self._with_room(now, state, self.planner.observe(now, event))
        if freed is not None and freed in state.gpus:
            out += self.training.decide(now, ServiceSlicesChanged(freed), state)
        return out

    def _with_room(self, now: float, st: ClusterState, ds: Sequence[Decision]
                   ) -> list[Decision]:
        """The planner's decisions, each ``StartReplica`` preceded by the checkpoints of the
        jobs it displaces (and a ``WakeUp`` so the training policy re-places them)."""
        out: list[Decision] = []
        woken: set[str] = set()
        gone: set[str] = set()
        taking: dict[str, list[Placement]] = {}
        for d in ds:
            if isinstance(d, StartReplica) and d.gpu in st.gpus:
                for j in displaced(st, d.gpu, d.slot, taking.get(d.gpu, ())):
                    if j in gone:
                        continue
                    gone.add(j)
                    out.append(RequeueJob(j, f"replica {d.replica} of {d.service} takes "
                                             f"{d.slot} on {d.gpu}", cause=RequeueCause.OTHER,
                                          why={"trigger": "service", "note": (
                                              f"{j} is checkpointed: service {d.service} needs "
                                              f"{d.slot} on {d.gpu} (the GPU where a replica "
                                              f"stops the least training)")}))
                    woken.add(d.gpu)
                taking.setdefault(d.gpu, []).append(d.slot)
            out.append(d)
        out += [WakeUp(now, f"{SLICES_TAG}:{g}") for g in sorted(woken)]
        return out
