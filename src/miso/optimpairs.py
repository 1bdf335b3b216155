"""The optimizer's last step: which layout realises the winning arrangement, restarts priced.

Among the (arrangement, layout) pairs whose value is within the margin of the best, the one
with the highest value minus the penalties of the running jobs it moves; among (near-)equal
scores the one that keeps most running jobs, then the first in canonical order. Three ways to
score the same candidates, each to the bit the others' answer: numpy over many pairs
(:func:`best_pair`), plain Python over a few (:func:`best_of_few`), and plain Python over a
small table's distinct pairs (:func:`best_pair_small`). Each returns None when no candidate
holds the pinned jobs' instances (the optimizer raises).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from miso.mig.layouts import Layout, Placement
from miso.optimtables import Rep, SmallTables, Tables, place

#: Up to this many candidate pairs, :func:`best_pair` scores them in plain Python
#: (:func:`best_of_few`): numpy's per-call overhead outweighs a few rows.
FEW_PAIRS = 16


def first_best(scores: list[float], kept: list[int]) -> int:
    """The position of the pick among scored candidates: of the scores within 1e-9 of the
    top, the most running jobs kept (``kept``: per candidate, how many), then the first."""
    top = max(scores) - 1e-9
    most = max([k for sc, k in zip(scores, kept, strict=True) if sc >= top])
    return next(i for i, sc in enumerate(scores) if sc >= top and kept[i] == most)


def best_pair_small(small: SmallTables, unit: Mapping[Placement, int], jobs: Sequence[str],
                    vals: list[float], floor: float, cur: Mapping[str, Placement],
                    pen: Mapping[str, float], pin: Mapping[str, Placement]
                    ) -> tuple[float, int, Layout, tuple[Placement, ...]] | None:
    """:func:`best_pair` on a small table's Python lists, and the jobs' instances: the same
    candidate pairs in the same order, scored as :func:`best_of_few` scores them, but only the
    first of the pairs of an arrangement that keep and hold the same running jobs' instances
    (:meth:`SmallTables.reps`): the others score the same and keep as many, so the first of
    the best is among these. ``unit``: every placement's number in the tables."""
    none = len(unit)
    run = tuple([(i, unit.get(cur[j], none)) for i, j in enumerate(jobs) if j in cur])
    reps = small.reps(run, bool(pin))
    # per pinned job, its position among the running ones (a pair must hold its instance)
    need = [k for k, (i, _) in enumerate(run) if jobs[i] in pin]
    penv = [pen.get(j, 0.0) for j in jobs if j in cur] if pen else None
    scores: list[float] = []
    kept: list[int] = []
    cands: list[Rep] = []
    if len(run) == 1 and not need:
        # One running job: a pair that moves it costs 0.0 + its penalty (the sum below); one
        # that keeps it costs 0.0 (v - 0.0 is v to the bit).
        moved = 0.0 + penv[0] if penv is not None else 0.0
        for a, v in enumerate(vals):
            if v >= floor:
                for rep in reps[a]:
                    scores.append(v if rep[4] else v - moved)
                    kept.append(rep[4])
                    cands.append(rep)
    else:
        for a, v in enumerate(vals):
            if v < floor:
                continue
            for rep in reps[a]:
                if need and not all(rep[2][k] for k in need):
                    continue
                scores.append(v - moved_cost(rep[1], penv))
                kept.append(rep[4])
                cands.append(rep)
    if not cands:
        return None
    i = first_best(scores, kept)
    w, _, _, placed, _ = cands[i]
    return scores[i], small.pair_arr[w], small.pair_layout[w], placed


def best_pair(t: Tables, names: Sequence[str], jobs: Sequence[str], vals: np.ndarray,
              floor: float, cur: Mapping[str, Placement], pen: Mapping[str, float],
              pin: Mapping[str, Placement]
              ) -> tuple[float, int, Layout, tuple[Placement, ...]] | None:
    """The best (arrangement, layout) pair with a value of at least ``floor`` (the module's
    rule), vectorised over the pairs, and the jobs' instances in it (``names``: the profile
    names the arrangements index)."""
    pa = t.pair_arr
    ok = vals[pa] >= floor
    for pl in pin.values():
        u = t.unit.get(pl)
        if u is None:
            ok[:] = False
        else:
            ok &= t.pair_has[:, u]
    idx = ok.nonzero()[0]  # ok is 1-D: flatnonzero without its ravel
    if not idx.size:
        return None
    # kept[:, k]: the k-th running job keeps its instance (in the pair's layout, same profile).
    run = [(i, t.unit.get(cur[j], len(t.unit))) for i, j in enumerate(jobs) if j in cur]
    kept = t.pair_keeps[idx[:, None], [i for i, _ in run], [u for _, u in run]]
    if idx.size <= FEW_PAIRS:
        penv = [pen.get(j, 0.0) for j in jobs if j in cur] if pen else None
        k, score = best_of_few(vals[pa[idx]].tolist(), kept.tolist(), penv)
        w = int(idx[k])
    else:
        n_kept = np.add.reduce(kept, axis=1)
        # Penalties of the moved jobs, added one job at a time in order (the scalar loop's
        # sums; pinned jobs add an exact 0.0).
        if pen:
            penv = [pen.get(j, 0.0) for j in jobs if j in cur]
            cost = np.where(kept, 0.0, penv).cumsum(axis=1)[:, -1]
        else:
            cost = np.zeros(idx.size)
        scores = vals[pa[idx]] - cost
        near = scores >= scores.max() - 1e-9
        best = np.flatnonzero(near & (n_kept == n_kept[near].max()))[0]
        w, score = int(idx[best]), float(scores[best])
    a = int(pa[w])
    return score, a, t.pair_layout[w], place(names, t.arrangements[a], t.pair_layout[w],
                                             [cur.get(j) for j in jobs])


def moved_cost(keep: Sequence[bool], penv: list[float] | None) -> float:
    """The penalties of the running jobs a pair moves (``keep``: per running job, whether it
    keeps its instance), added one job at a time in order as numpy's ``cumsum`` adds them (the
    exact 0.0 it adds for a kept job is left out, which changes no sum)."""
    cost = 0.0
    if penv is not None:
        for kp, pv in zip(keep, penv, strict=True):
            if not kp:
                cost += pv
    return cost


def best_of_few(vals: list[float], kept: list[list[bool]], penv: list[float] | None
                ) -> tuple[int, float]:
    """(position, score) of the best of a few candidate pairs, exactly as the vectorised
    :func:`best_pair` picks it (:func:`first_best` of value minus :func:`moved_cost`)."""
    scores = [v - moved_cost(row, penv) for v, row in zip(vals, kept, strict=True)]
    best = first_best(scores, [sum(row) for row in kept])
    return best, scores[best]
