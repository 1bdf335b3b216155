"""Enumerate, validate and compare MIG layouts (placed GPU instances) of one GPU.

A *layout* is a set of placed instances ``profile@start``. It is valid when every placement is in
the profile's table, no two instances overlap in placement units, no profile exceeds its instance
count, and the driver rules hold (pre-R510 drivers refuse 4g+3g together on A100-class GPUs;
some profiles need a minimum driver). Pure functions; no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache

from miso.mig.gpumodel import GpuModel, Profile
from miso.mig.tables import gpu_model

#: Driver major version assumed when none is given: current drivers (no 4g+3g ban).
CURRENT_DRIVER = 580


@dataclass(frozen=True, order=True)
class Placement:
    """One GPU instance: a profile placed at a start index (in placement units)."""

    start: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"

    def to_json(self) -> dict[str, object]:
        return {"profile": self.profile, "start": self.start}


Layout = tuple[Placement, ...]
"""A layout: placements sorted by start (the canonical form)."""


def canonical(placements: Iterable[Placement]) -> Layout:
    """Sort placements into the canonical layout form."""
    return tuple(sorted(placements))


@dataclass(frozen=True, eq=False)
class Geometry:
    """A GPU model restricted to a profile subset under one driver version.

    Everything here depends only on (model, profiles, driver); build it once with
    :func:`geometry` (cached) and reuse it. Geometries key many caches, so the hash is computed
    once (from the model name, profile names and driver) and equality checks identity first.
    """

    model: GpuModel
    profiles: tuple[Profile, ...]
    driver: int
    _hash: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        key = (self.model.name, tuple(p.name for p in self.profiles), self.driver)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Geometry):
            return NotImplemented
        return (self._hash == other._hash and self.driver == other.driver
                and self.model == other.model and self.profiles == other.profiles)

    @property
    def legacy_ban(self) -> bool:
        return self.model.legacy_4g3g_ban and self.driver < 510

    def candidates(self) -> tuple[tuple[Placement, int], ...]:
        """All (placement, occupied-unit bitmask) pairs allowed by the table."""
        out = []
        for p in self.profiles:
            for s in p.starts:
                mask = ((1 << p.size) - 1) << s
                out.append((Placement(s, p.name), mask))
        out.sort(key=lambda t: (t[0].start, t[0].profile))
        return tuple(out)


def geometry(
    model: GpuModel | str, profiles: Sequence[str] | None = None, driver: int | None = None
) -> Geometry:
    """Build (cached) the geometry of ``model`` with ``profiles`` (default: the scheduler's)."""
    m = gpu_model(model) if isinstance(model, str) else model
    names = tuple(profiles) if profiles is not None else tuple(
        p.name for p in m.default_profiles())
    return _geometry(m.name, names, driver if driver is not None else CURRENT_DRIVER)


@cache
def _geometry(model_name: str, names: tuple[str, ...], driver: int) -> Geometry:
    m = gpu_model(model_name)
    profs = []
    for n in dict.fromkeys(names):
        p = m.profile(n)
        if p.min_driver is not None and driver < p.min_driver:
            raise ValueError(f"profile {n} on {m.name} needs driver R{p.min_driver}+, "
                             f"got R{driver}")
        profs.append(p)
    return Geometry(m, tuple(profs), driver)


def beside(geom: Geometry, reserved: Iterable[Placement]) -> Geometry:
    """The geometry of the slices ``geom`` leaves free around the instances ``reserved`` (an
    inference service's replicas): every profile keeps only the starts that overlap no reserved
    instance, its instance count and the GPU's shrink by the reserved ones; a profile with no
    start left stays, with none (speed tables keep the GPU's profiles; no layout uses it). A
    layout is valid on it exactly when it is valid on ``geom`` together with ``reserved``
    (current drivers). Cached: equal reservations give one object. No reservation: ``geom``."""
    res = tuple(sorted(reserved))
    if not res:
        return geom
    return _beside(geom, res)


@cache
def _beside(geom: Geometry, res: tuple[Placement, ...]) -> Geometry:
    from dataclasses import replace

    probs = violations(geom, res)
    if probs:
        raise ValueError(f"reserved instances invalid on {geom.model.name}: {'; '.join(probs)}")
    by = {p.name: p for p in geom.model.profiles}
    used = 0
    count: Counter[str] = Counter()
    for pl in res:
        used |= ((1 << by[pl.profile].size) - 1) << pl.start
        count[pl.profile] += 1
    profs = []
    for p in geom.profiles:
        starts = tuple(s for s in p.starts if not (((1 << p.size) - 1) << s) & used)
        left = max(0, p.max_count - count[p.name])
        if not starts or not left:
            starts, left = (), 0
        profs.append(replace(p, starts=starts, max_count=left))
    model = replace(geom.model, max_instances=geom.model.max_instances - len(res))
    return Geometry(model, tuple(profs), geom.driver)


#: :func:`violations` of layouts given as tuples, remembered: the simulator checks every
#: plan twice (the state's contract check, the transition), among a few hundred layouts.
_VIOLATIONS: dict[tuple[Geometry, tuple[Placement, ...]], tuple[str, ...]] = {}


def violations(geom: Geometry, layout: Iterable[Placement]) -> list[str]:
    """Explain why ``layout`` is invalid on ``geom``; an empty list means it is valid."""
    if not isinstance(layout, tuple):
        return _violations(geom, layout)
    got = _VIOLATIONS.get((geom, layout))
    if got is None:
        if len(_VIOLATIONS) >= 4096:
            _VIOLATIONS.clear()
        got = _VIOLATIONS[(geom, layout)] = tuple(_violations(geom, layout))
    return list(got)


def _violations(geom: Geometry, layout: Iterable[Placement]) -> list[str]:
    problems: list[str] = []
    placed = list(layout)
    allowed = {p.name: p for p in geom.profiles}
    occupied: dict[int, Placement] = {}
    counts: Counter[str] = Counter()
    for pl in placed:
        prof = allowed.get(pl.profile)
        if prof is None:
            try:
                full = geom.model.profile(pl.profile)
            except KeyError:
                problems.append(f"{pl}: {geom.model.name} has no profile {pl.profile}")
                continue
            if full.min_driver is not None and geom.driver < full.min_driver:
                problems.append(f"{pl}: {pl.profile} needs driver R{full.min_driver}+ "
                                f"(driver rule), got R{geom.driver}")
            else:
                problems.append(f"{pl}: profile {pl.profile} is not in the allowed set")
            continue
        if pl.start not in prof.starts:
            starts = ",".join(map(str, prof.starts))
            problems.append(f"{pl}: start {pl.start} not allowed for {pl.profile} "
                            f"(allowed starts {{{starts}}})")
            continue
        counts[pl.profile] += 1
        for u in range(pl.start, pl.start + prof.size):
            if u in occupied:
                problems.append(f"{pl}: overlaps {occupied[u]} at unit {u}")
                break
            occupied[u] = pl
    for name, c in counts.items():
        if c > allowed[name].max_count:
            limit = allowed[name].max_count
            problems.append(f"{name}: {c} instances exceed the maximum of {limit}")
    if len(placed) > geom.model.max_instances:
        problems.append(f"{len(placed)} instances exceed the GPU maximum of "
                        f"{geom.model.max_instances}")
    if geom.legacy_ban:
        g = {allowed[pl.profile].compute_slices for pl in placed if pl.profile in allowed}
        if 4 in g and 3 in g:
            problems.append(f"4g and 3g instances together are refused by drivers before R510 "
                            f"(driver rule, running R{geom.driver})")
    return problems


def is_valid(geom: Geometry, layout: Iterable[Placement]) -> bool:
    """True when :func:`violations` finds nothing."""
    return not violations(geom, layout)


@cache
def _enumerate(geom: Geometry) -> tuple[tuple[Layout, ...], tuple[Layout, ...]]:
    """(all valid non-empty layouts, maximal layouts), both sorted."""
    cands = geom.candidates()
    prof = {p.name: p for p in geom.profiles}
    g_of = {p.name: p.compute_slices for p in geom.profiles}
    results: list[Layout] = []
    maximal: list[Layout] = []

    def fits(pl: Placement, mask: int, used: int, counts: Counter[str], gs: set[int]) -> bool:
        if used & mask or counts[pl.profile] >= prof[pl.profile].max_count:
            return False
        if sum(counts.values()) >= geom.model.max_instances:
            return False
        g = g_of[pl.profile]
        return not (geom.legacy_ban and ((g == 4 and 3 in gs) or (g == 3 and 4 in gs)))

    def rec(i: int, used: int, chosen: list[Placement], counts: Counter[str]) -> None:
        gs = {g_of[c.profile] for c in chosen}
        if chosen:
            layout = tuple(chosen)
            results.append(layout)
            if not any(fits(pl, m, used, counts, gs) for pl, m in cands):
                maximal.append(layout)
        for j in range(i, len(cands)):
            pl, m = cands[j]
            if fits(pl, m, used, counts, gs):
                chosen.append(pl)
                counts[pl.profile] += 1
                rec(j + 1, used | m, chosen, counts)
                counts[pl.profile] -= 1
                chosen.pop()

    rec(0, 0, [], Counter())
    # Candidates are visited in (start, profile) order and each layout is built in that order,
    # so every layout is already canonical and produced exactly once.
    return tuple(sorted(results)), tuple(sorted(maximal))


def enumerate_layouts(geom: Geometry, *, maximal: bool = False) -> tuple[Layout, ...]:
    """Every valid non-empty layout of ``geom`` (or only the maximal ones)."""
    all_, max_ = _enumerate(geom)
    return max_ if maximal else all_


def multiset(geom: Geometry, layout: Iterable[Placement]) -> tuple[str, ...]:
    """The profiles of a layout as a sorted multiset (largest compute first)."""
    g = {p.name: (p.compute_slices, p.size) for p in geom.profiles}
    return tuple(sorted((pl.profile for pl in layout), key=lambda n: (-g[n][0], -g[n][1], n)))


def multisets(geom: Geometry, *, maximal: bool = False) -> tuple[tuple[str, ...], ...]:
    """Distinct profile multisets among the (maximal) layouts."""
    return tuple(sorted({multiset(geom, lay) for lay in enumerate_layouts(geom, maximal=maximal)}))
