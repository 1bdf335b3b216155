"""The exact optimizer's per (geometry, job count) tables (:class:`Tables`), built once per
geometry by :func:`build_tables`: every job-to-profile arrangement some valid layout realises,
and every (arrangement, layout) pair with the instances it keeps; and the two placement rules
a solve resolves its answer with (:func:`place`, :func:`addable`).

Why tables: the value of an assignment depends only on which profile each job gets, so
:class:`miso.optimize.PartitionOptimizer` scores a mix with one gather-and-sum over a
table's rows and resolves instances afterwards.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from miso.mig.layouts import Geometry, Layout, Placement, enumerate_layouts, multiset


@dataclass(frozen=True)
class Tables:
    """Per (geometry, job count) precomputation."""

    arrangements: np.ndarray  # (K, n) profile indices
    arr_multiset: np.ndarray  # (K,) multiset id
    multiset_layouts: tuple[tuple[Layout, ...], ...]  # per multiset id
    default_assign: tuple[tuple[Placement, ...], ...]  # per arrangement, on its first layout
    flat: np.ndarray  # (K, n) indexes into a flattened (n, profiles) speed matrix
    # Every (arrangement, layout of its multiset) pair, by arrangement then layout order:
    pair_arr: np.ndarray  # (P,) arrangement index
    pair_layout: tuple[Layout, ...]  # (P,)
    pair_has: np.ndarray  # (P, U) bool: the pair's layout holds placement u
    pair_keeps: np.ndarray  # (P, n, U + 1) bool: job i keeps instance u (U: a foreign one)
    unit: dict[Placement, int]  # placement -> u


def place(names: Sequence[str], arr: Sequence[int], lay: Layout,
          current: Sequence[Placement | None]) -> tuple[Placement, ...]:
    """Instances of ``lay`` for jobs whose profiles are ``arr`` (indexes into ``names``), in job
    order: a job whose current instance is in the layout with its profile keeps it; the others
    take the free instances of their profile in canonical order."""
    free = list(lay)
    out: list[Placement | None] = [None] * len(arr)
    for i, c in enumerate(current):
        if c is not None and c in free and c.profile == names[arr[i]]:
            out[i] = c
            free.remove(c)
    for i, pi in enumerate(arr):
        if out[i] is None:
            pl = next(p for p in free if p.profile == names[pi])
            out[i] = pl
            free.remove(pl)
    return tuple(pl for pl in out if pl is not None)

@cache
def addable(geom: Geometry, placed: tuple[Placement, ...]) -> frozenset[str]:
    """Profiles of the instances a valid layout can add to the instances ``placed``."""
    have = set(placed)
    return frozenset(pl.profile for lay in enumerate_layouts(geom) if len(lay) == len(have) + 1
                     and have <= set(lay) for pl in lay if pl not in have)

def build_tables(geom: Geometry, n: int) -> Tables:
    names = tuple(p.name for p in geom.profiles)
    idx = {nm: i for i, nm in enumerate(names)}
    by_ms: dict[tuple[str, ...], list[Layout]] = {}
    for lay in enumerate_layouts(geom):
        if len(lay) == n:
            by_ms.setdefault(multiset(geom, lay), []).append(lay)
    rows: list[tuple[int, ...]] = []
    ms_ids: list[int] = []
    layouts: list[tuple[Layout, ...]] = []
    for mi, (ms, lays) in enumerate(sorted(by_ms.items())):
        layouts.append(tuple(lays))
        for perm in sorted(set(itertools.permutations([idx[p] for p in ms]))):
            rows.append(perm)
            ms_ids.append(mi)
    arr = np.array(rows, dtype=np.intp).reshape(len(rows), n)
    no_current = [None] * n
    default_assign = tuple(place(names, row, layouts[mi][0], no_current)
                           for row, mi in zip(rows, ms_ids, strict=True))
    unit = {pl: u for u, (pl, _) in enumerate(geom.candidates())}
    pair_arr = [a for a, mi in enumerate(ms_ids) for _ in layouts[mi]]
    pair_layout = tuple(lay for mi in ms_ids for lay in layouts[mi])
    has = np.zeros((len(pair_layout), len(unit)), dtype=bool)
    for p, lay in enumerate(pair_layout):
        has[p, [unit[pl] for pl in lay]] = True
    pa = np.array(pair_arr, dtype=np.intp)
    unit_prof = np.array([idx[pl.profile] for pl in unit], dtype=np.intp)
    keeps = np.zeros((len(pair_layout), n, len(unit) + 1), dtype=bool)
    keeps[:, :, :-1] = has[:, None, :] & (arr[pa][:, :, None] == unit_prof[None, None, :])
    flat = arr + np.arange(n)[None, :] * len(names)
    return Tables(arr, np.array(ms_ids, dtype=np.intp), tuple(layouts), default_assign,
                   flat, pa, pair_layout, has, keeps, unit)


#: One pair of a small table for a set of running jobs (:meth:`SmallTables.reps`): (pair,
#: per running job whether it keeps its instance, per running job whether the pair's layout
#: holds its instance, the instances of the jobs in job order, how many running jobs keep
#: theirs).
Rep = tuple[int, tuple[bool, ...], tuple[bool, ...], tuple[Placement, ...], int]


@dataclass(frozen=True)
class SmallTables:
    """A table of one or two jobs as Python lists: there a solve's numpy calls cost more than
    its arithmetic. An arrangement's value is one speed or the sum of two (the same float in
    any order), so these values are numpy's to the bit."""

    arr: tuple[tuple[int, ...], ...]  # per arrangement, its profile indexes
    pairs_of: tuple[range, ...]  # per arrangement, its pairs (consecutive)
    pair_arr: tuple[int, ...]  # per pair, its arrangement
    has: tuple[frozenset[int], ...]  # per pair, the placements u its layout holds
    keeps: list[list[list[bool]]]  # Tables.pair_keeps as lists
    names: tuple[str, ...] = ()  # profile names (the arrangements' indexes)
    pair_layout: tuple[Layout, ...] = ()  # Tables.pair_layout
    units: tuple[Placement, ...] = ()  # placement by u (Tables.unit inverted)
    _reps: dict[tuple[tuple[tuple[int, int], ...], bool], tuple[tuple[Rep, ...], ...]] = \
        field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, t: Tables, names: Sequence[str] = ()) -> SmallTables:
        pa = [int(a) for a in t.pair_arr]
        first = {a: pa.index(a) for a in set(pa)}
        return cls(tuple(tuple(int(x) for x in row) for row in t.arrangements),
                   tuple(range(first[a], first[a] + pa.count(a))
                         for a in range(len(t.arrangements))),
                   tuple(pa), tuple(frozenset(int(u) for u in row.nonzero()[0])
                                    for row in t.pair_has), t.pair_keeps.tolist(),
                   tuple(names), t.pair_layout, tuple(t.unit))

    def values(self, rows: list[list[float]]) -> list[float]:
        """Each arrangement's sum of speeds (``rows``: :meth:`PartitionOptimizer.speed_rows`)."""
        if len(rows) == 1:
            r = rows[0]
            return [r[p] for p, in self.arr]
        r0, r1 = rows
        return [r0[p] + r1[q] for p, q in self.arr]

    def reps(self, run: tuple[tuple[int, int], ...], held: bool = True
             ) -> tuple[tuple[Rep, ...], ...]:
        """Per arrangement, its pairs that differ for the running jobs ``run`` ((job index,
        u of its instance; ``len(units)``: one no layout holds)): of the pairs with the same
        instances kept (and, with ``held``, held: pinned jobs need theirs held), only the
        first, which every rule that picks the first of equals prefers (the others score the
        same and keep the same). Remembered per ``run``; each with the jobs' instances
        (:func:`place`)."""
        got = self._reps.get((run, held))
        if got is None:
            n = len(self.arr[0]) if self.arr else 0
            current: list[Placement | None] = [None] * n
            for i, u in run:
                current[i] = self.units[u] if u < len(self.units) else None
            out = []
            for a, prange in enumerate(self.pairs_of):
                seen: set[tuple[tuple[bool, ...], tuple[bool, ...]]] = set()
                row = []
                for p in prange:
                    keep = tuple(self.keeps[p][i][u] for i, u in run)
                    holds = tuple(u in self.has[p] for _, u in run)
                    if (keep, holds if held else ()) not in seen:
                        seen.add((keep, holds if held else ()))
                        row.append((p, keep, holds, place(self.names, self.arr[a],
                                                          self.pair_layout[p], current),
                                    sum(keep)))
                out.append(tuple(row))
            got = self._reps[(run, held)] = tuple(out)
        return got
