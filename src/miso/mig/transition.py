"""Plan the change from one MIG layout (with jobs) to another.

Instances present in both layouts are kept; the others are destroyed (compute instance first,
then GPU instance) and created with explicit placements. With explicit placements NVML accepts
any creation order once the destroys are done; we still create large instances first, which is
also the order that works with driver-chosen placement. A running job whose instance is kept and
still assigned to it is not touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from miso.mig.layouts import Geometry, Layout, Placement, canonical, violations


@dataclass(frozen=True)
class TransitionPlan:
    """Steps to go from the current layout to the target.

    ``checkpoint`` are running jobs that must save and stop (their instance goes away or they
    move); ``start`` are jobs to (re)start on their target instance after the change; ``untouched``
    keep running throughout.
    """

    keep: Layout
    destroy: Layout
    create: Layout
    checkpoint: tuple[str, ...]
    start: tuple[tuple[str, Placement], ...]
    untouched: tuple[str, ...]

    @property
    def is_noop(self) -> bool:
        return not (self.destroy or self.create or self.checkpoint or self.start)


class TransitionError(ValueError):
    """The target layout or assignment is invalid."""


def plan_transition(
    geom: Geometry,
    current_layout: Iterable[Placement],
    current_jobs: Mapping[str, Placement],
    target_layout: Iterable[Placement],
    target_jobs: Mapping[str, Placement],
) -> TransitionPlan:
    """Compute the transition; raises :class:`TransitionError` on an invalid target."""
    cur = canonical(current_layout)
    tgt = canonical(target_layout)
    problems = violations(geom, tgt)
    if problems:
        raise TransitionError("invalid target layout: " + "; ".join(problems))
    tgt_set = set(tgt)
    for j, pl in target_jobs.items():
        if pl not in tgt_set:
            raise TransitionError(f"job {j} assigned to {pl}, which is not in the target layout")
    owners: dict[Placement, str] = {}
    for j, pl in target_jobs.items():
        if pl in owners:
            raise TransitionError(f"jobs {owners[pl]} and {j} both assigned to {pl}")
        owners[pl] = j
    cur_set = set(cur)
    keep = tuple(pl for pl in cur if pl in tgt_set)
    destroy = tuple(pl for pl in cur if pl not in tgt_set)
    size = {p.name: p.size for p in geom.model.profiles}
    create = tuple(sorted((pl for pl in tgt if pl not in cur_set),
                          key=lambda pl: (-size[pl.profile], pl.start, pl.profile)))
    untouched = tuple(sorted(j for j, pl in current_jobs.items()
                             if target_jobs.get(j) == pl and pl in cur_set))
    checkpoint = tuple(sorted(j for j in current_jobs if j not in untouched))
    start = tuple(sorted(((j, pl) for j, pl in target_jobs.items() if j not in untouched),
                         key=lambda t: (t[1], t[0])))
    return TransitionPlan(keep, destroy, create, checkpoint, start, untouched)
