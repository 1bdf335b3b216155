"""Where service replicas go: the slots of the GPUs the service planner may use.

Pure (no I/O). :class:`ReplicaSlots` keeps, per GPU, the replicas' slots (``held``) and
answers where one more replica of a profile goes (:meth:`ReplicaSlots.place`):

* **Spreading**: the caller names GPUs to avoid (a service's own, until it spans two), so
  one GPU's repartition never takes a whole service down;
* **Packing**: GPUs that already host service slices first, fullest first (whole GPUs stay
  free for training), a fresh GPU last;
* **Restart economy**: with a ``slot_cost`` (the training a slot displaces:
  :class:`~miso.sched.servicepolicy.ServicesFirst`) the cheapest slot of a tier wins, else
  the first that fits.

The planner's events and rules (how many replicas, of which profiles, when) are
:mod:`miso.sched.serviceplan`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from miso.mig import Geometry, Placement, geometry, is_valid


class ReplicaSlots:
    """The replicas' slots on a set of GPUs (ids -> GPU model names)."""

    def __init__(self, gpus: Mapping[str, str]) -> None:
        self.gpus: dict[str, Geometry] = {g: geometry(m) for g, m in gpus.items()}
        self.order = list(gpus)
        #: per GPU: (service, replica, slot) of each replica there
        self.held: dict[str, list[tuple[str, str, Placement]]] = {g: [] for g in gpus}
        #: GPUs the planner must not use (e.g. held by training the driver will not move)
        self.blocked: set[str] = set()
        #: the price of putting a replica on (gpu, slot): the training progress it displaces
        #: (:class:`~miso.sched.servicepolicy.ServicesFirst` sets it from the cluster state);
        #: None: first fit. Among the GPUs of one placement tier the cheapest slot wins.
        self.slot_cost: Callable[[str, Placement], float] | None = None

    def add_gpu(self, gpu: str, model: str) -> bool:
        """A GPU joined (False: known already)."""
        if gpu in self.gpus:
            return False
        self.gpus[gpu] = geometry(model)
        self.order.append(gpu)
        self.held[gpu] = []
        return True

    def remove_gpu(self, gpu: str) -> list[tuple[str, str]]:
        """A GPU left: (service, replica) of each replica it held."""
        lost = [(svc, rid) for svc, rid, _ in self.held.pop(gpu, [])]
        self.gpus.pop(gpu, None)
        if gpu in self.order:
            self.order.remove(gpu)
        return lost

    def hold(self, gpu: str, service: str, replica: str, slot: Placement) -> None:
        self.held[gpu].append((service, replica, slot))

    def release(self, gpu: str, replica: str) -> None:
        self.held[gpu] = [h for h in self.held[gpu] if h[1] != replica]

    def slot_on(self, gpu: str, profile: str) -> Placement | None:
        """The first valid slot (no ``slot_cost``) or the cheapest one of ``profile`` on
        ``gpu`` beside its replicas."""
        geom = self.gpus[gpu]
        held = [pl for _, _, pl in self.held[gpu]]
        prof = geom.model.profile(profile)
        best: tuple[float, Placement] | None = None
        for start in prof.starts:
            cand = Placement(start, profile)
            if is_valid(geom, [*held, cand]):
                if self.slot_cost is None:
                    return cand
                c = self.slot_cost(gpu, cand)
                if best is None or c < best[0]:
                    best = (c, cand)
        return best[1] if best else None

    def place(self, profile: str, avoid: set[str]) -> tuple[str, Placement] | None:
        """A GPU and slot for one more replica: GPUs hosting service slices first (fullest
        first), avoiding ``avoid`` (the service's own GPUs) when another GPU can take it."""
        used = [g for g in self.order if self.held[g] and g not in self.blocked]
        used.sort(key=lambda g: -sum(self.gpus[g].model.profile(pl.profile).compute_slices
                                     for _, _, pl in self.held[g]))
        fresh = [g for g in self.order if not self.held[g] and g not in self.blocked]
        for pool in ([g for g in used if g not in avoid], [g for g in fresh if g not in avoid],
                     used, fresh):
            spot = self.cheapest_slot(pool, profile)
            if spot is not None:
                return spot
        return None

    def cheapest_slot(self, pool: list[str], profile: str) -> tuple[str, Placement] | None:
        """The first GPU of ``pool`` with a ``profile`` slot, or with ``slot_cost`` the one
        whose slot displaces least (ties: the earlier GPU)."""
        best: tuple[float, int, str, Placement] | None = None
        for i, g in enumerate(pool):
            slot = self.slot_on(g, profile)
            if slot is None:
                continue
            if self.slot_cost is None:
                return g, slot
            c = self.slot_cost(g, slot)
            if best is None or (c, i) < best[:2]:
                best = (c, i, g, slot)
            if c <= 0:
                break  # displaces nothing: the first such GPU of the tier
        return None if best is None else (best[2], best[3])

    def gpus_in_use(self) -> list[str]:
        """GPUs holding at least one service slice."""
        return [g for g in self.order if self.held[g]]

    def slices_in_use(self, gpu: str) -> int:
        geom = self.gpus[gpu]
        return sum(geom.model.profile(pl.profile).compute_slices for _, _, pl in self.held[gpu])

