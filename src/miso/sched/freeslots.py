"""GPUs with a free landing slot, kept incrementally (issue 32: the live loop at 1,024 GPUs).

In a burst miso+ lands a newcomer whose least crowded GPU has no free slot on the least crowded
GPU that has one (:meth:`miso.sched.policies.burst.Burst.landing_gpu`). Scanning every candidate
GPU's layout per queued job made a placement pass cost (queued jobs x GPUs) when slots ran out:
80 % of the live loop's time at 1,024 GPUs. Here a GPU's free slots are computed when it
changes (the :class:`~miso.sched.occupancy.Occupancy` upkeep: the state's change hook and the
GPUs a ``decide`` call touched), and it sits in a class of the policy's own occupancy index
tagged with the fit classes it has a free slot for, so a query walks only GPUs that can take
the job, in the candidate order (least crowded, then GPU order).

A GPU's free slots for a job (:func:`free_slots`) depend on its layout (the one being applied,
else the applied one), its target assignment, the jobs placed on it in this call and the job's
fitting profiles (its fit class): all re-read when the GPU is re-keyed, so the index answers as
the scan would (tests/test_freeslots.py compares every landing answer with the scan and runs
every solve that :func:`room_beside` skips).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from functools import cache, lru_cache

from miso.mig import Geometry, Placement
from miso.mig.layouts import enumerate_layouts
from miso.sched.decisions import ApplyLayout
from miso.sched.occupancy import Occupancy
from miso.sched.policies.base import Scratch, fit_classes


def _free_and_waiting(sc: Scratch, g: str) -> tuple[list[str], int]:
    """Profiles of ``g``'s free instances (the layout being applied, else the applied one,
    less the instances of its target assignment) and how many jobs placed on ``g`` have no
    instance yet (placed in this call)."""
    gs = sc.state.gpus[g]
    layout = gs.pending.layout if isinstance(gs.pending, ApplyLayout) else gs.layout
    asg = gs.target_assignment()
    used = set(asg.values())
    free = [pl.profile for pl in layout if pl not in used]
    waiting = sum(1 for j in sc.jobs_on(g) if j not in asg)
    return free, waiting


def free_slots(sc: Scratch, g: str, fits: tuple[str, ...]) -> int:
    """Instances of ``g``'s layout free for a job that fits the profiles ``fits``: unassigned,
    large enough, not promised to a job placed there this call."""
    free, waiting = _free_and_waiting(sc, g)
    return sum(1 for p in free if p in fits) - waiting


def open_fits(sc: Scratch, g: str) -> tuple[tuple[str, ...], ...]:
    """The fit classes of ``g``'s geometry with a free slot on ``g`` (:func:`free_slots` > 0)."""
    free, waiting = _free_and_waiting(sc, g)
    if len(free) <= waiting:
        return ()
    return tuple(f for f in fit_classes(sc.state.gpus[g].geom)
                 if sum(1 for p in free if p in f) > waiting)


@cache
def room_beside(geom: Geometry, pinned: frozenset[Placement]) -> dict[str, int]:
    """Per profile ``q``: the most instances of a valid layout of ``geom`` that holds every
    placement of ``pinned`` and an instance of ``q`` besides them (absent: none does). A
    layout the optimizer returns with the pinned jobs on their instances and a newcomer on a
    ``q`` instance is one of these, with an instance per job: so when no ``q`` the newcomer may
    take has a layout of at least as many instances as jobs, no solve can succeed
    (:meth:`~miso.sched.policies.placing.GpuChoice.fits_beside_pinned` skips it)."""
    out: dict[str, int] = {}
    for lay in enumerate_layouts(geom):
        s = set(lay)
        if pinned <= s:
            for pl in s - pinned:
                if out.get(pl.profile, 0) < len(lay):
                    out[pl.profile] = len(lay)
    return out


@lru_cache(maxsize=1 << 16)
def most_jobs_beside(geom: Geometry, pinned: frozenset[Placement], profiles: tuple[str, ...]
                     ) -> int:
    """The most jobs a layout of ``geom`` holds with ``pinned`` kept and a newcomer on one of
    ``profiles`` (:func:`room_beside`); 0: none."""
    room = room_beside(geom, pinned)
    return max((room.get(q, 0) for q in profiles), default=0)


class FreeSlots:
    """The GPUs of a policy's occupancy classes that have a free slot, as an
    :class:`Occupancy` whose class is (the policy's class, the open fit classes) and whose
    tags are the policy's tags ``(..., fit class)`` whose fit class is open. ``keep``: which
    policy classes to index at all (the burst regime: 0 < residents < ``burst_jobs``)."""

    def __init__(self, base_key: Callable[[Scratch, str], Hashable | None],
                 base_tags: Callable[[Hashable], Iterable[Hashable]] | None,
                 keep: Callable[[Hashable], bool]) -> None:
        self.base_key = base_key
        self.base_tags = base_tags
        self.keep = keep
        self.occ: Occupancy[Scratch] = Occupancy(self._key, self._tags)

    def _key(self, sc: Scratch, g: str) -> Hashable | None:
        base = self.base_key(sc, g)
        if base is None or not self.keep(base):
            return None
        got = open_fits(sc, g)
        return (base, got) if got else None

    def _tags(self, cls: Hashable) -> list[Hashable]:
        base, got = cls  # type: ignore[misc]
        if self.base_tags is None:
            return []
        return [t for t in self.base_tags(base) if t[-1] in got]  # type: ignore[index]
