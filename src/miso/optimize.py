"""Exact per-GPU partition optimizer: the best valid MIG layout and job-to-slice assignment.

The MISO problem: given up to 7 jobs (fewer on smaller GPUs) and each job's speed on every
profile (relative to the full GPU; a missing profile means the job does not fit there), choose a
valid layout with exactly one instance per job and the assignment that maximises the sum of
speeds. Ties go to the solution that restarts the fewest currently running jobs.

Why it is fast: the value of an assignment depends only on which *profile* each job gets, not on
where the instance sits. Per geometry and job count we precompute every distinct job-to-profile
arrangement that some valid layout realises, so a solve is one vectorised gather-and-sum over a
few hundred rows; placements are resolved afterwards among the layouts of the winning multiset.

Objectives: ``throughput`` (the paper), ``restart-aware`` (throughput minus a penalty per running
job that must move), ``fairness`` (sum of log speeds, proportional fairness).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache, partial
from typing import Any

import numpy as np

from miso.mig.layouts import Geometry, Layout, Placement, enumerate_layouts
from miso.optimpairs import best_pair, best_pair_small
from miso.optimtables import SmallTables, Tables, addable, build_tables

MAX_SPEED = 1.5
_NEG = -1e9


def valid_speed(s: object) -> bool:
    """Whether ``s`` is a speed the optimizer takes: a number in (0, MAX_SPEED] (NaN fails
    both comparisons; bools and strings fail the type check)."""
    return type(s) in (int, float) and 0.0 < s <= MAX_SPEED  # type: ignore[operator]


class Objective(StrEnum):
    """What the optimizer maximises."""

    THROUGHPUT = "throughput"
    RESTART_AWARE = "restart-aware"
    FAIRNESS = "fairness"


#: Objective by value: the enum's own lookup by value costs microseconds per solve
_OBJECTIVES: dict[str, Objective] = {o.value: o for o in Objective}


class OptimizerError(ValueError):
    """Bad optimizer input: too many jobs, bad speeds, or a mix no layout can hold."""


class Unreachable(OptimizerError):
    """The objective cannot exceed the ``above`` given to :meth:`PartitionOptimizer.solve`."""


@dataclass(frozen=True)
class Solution:
    """The chosen layout and assignment.

    ``objective`` is the value of the objective that was optimised; ``throughput`` is always the
    plain sum of speeds; ``restarted`` lists jobs of ``current`` whose instance changes.
    """

    layout: Layout
    assignment: dict[str, Placement]
    objective: float
    throughput: float
    restarted: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        job_of = {pl: j for j, pl in self.assignment.items()}
        return {
            "objective": self.objective,
            "layout": [
                {"profile": pl.profile, "start": pl.start, "job": job_of.get(pl)}
                for pl in self.layout
            ],
        }



#: Solutions a remembering optimizer keeps before it starts afresh (about 1 KB each).
MEMO_SIZE = 4096


class PartitionOptimizer:
    """Exact optimizer for one geometry. Build once per (GPU model, profiles, driver).

    With ``memo`` (:func:`remembering_optimizer`), :meth:`solve` remembers its answers by
    their exact inputs (a solve is a pure function of them): for a caller that asks the same
    question again and again, e.g. miso+'s admission weighing a job that waits at the head of
    the queue against the same GPU at every event. A remembered answer costs about a quarter
    of a solve, so callers whose questions rarely repeat use :func:`optimizer_for`."""

    def __init__(self, geom: Geometry, memo: bool = False) -> None:
        self.geom = geom
        self._memo: dict[tuple[object, ...], tuple[Solution | None, type | None, str]] | None = \
            {} if memo else None
        self.profile_names = tuple(p.name for p in geom.profiles)
        self.profile_index = {n: i for i, n in enumerate(self.profile_names)}
        self.max_jobs = max((len(lay) for lay in enumerate_layouts(geom)), default=0)
        self._tables = {n: build_tables(geom, n) for n in range(1, self.max_jobs + 1)}
        self._small = {n: SmallTables.of(self._tables[n], self.profile_names)
                       for n in (1, 2) if n in self._tables}
        #: every placement's unit (the tables' shared numbering)
        self._unit = self._tables[1].unit if self.max_jobs else {}

    # -- core ---------------------------------------------------------------------------
    def speed_matrix(self, jobs: Sequence[str], speeds: Mapping[str, Mapping[str, float]],
                     *, log: bool = False) -> np.ndarray:
        """Jobs x profiles matrix of speeds (or log speeds), a large negative value where a job
        does not fit; validates input."""
        return np.array(self.speed_rows(jobs, speeds, log=log), dtype=float)

    def speed_rows(self, jobs: Sequence[str], speeds: Mapping[str, Mapping[str, float]],
                   *, log: bool = False) -> list[list[float]]:
        """:meth:`speed_matrix` as Python lists (one row per job)."""
        index = self.profile_index
        rows = []
        for j in jobs:
            row = [_NEG] * len(index)
            for prof, s in speeds[j].items():
                i = index.get(prof)
                if i is None:
                    raise OptimizerError(
                        f"job {j}: profile {prof!r} is not one of {', '.join(self.profile_names)}"
                        f" on {self.geom.model.name}")
                if not valid_speed(s):
                    raise OptimizerError(f"job {j}: speed {s!r} on {prof} is outside (0, 1.5]")
                row[i] = math.log(s) if log else float(s)
            rows.append(row)
        return rows

    def solve(
        self,
        speeds: Mapping[str, Mapping[str, float]],
        *,
        current: Mapping[str, Placement] | None = None,
        objective: Objective | str = Objective.THROUGHPUT,
        restart_penalty: float | Mapping[str, float] = 0.1,
        pinned: Collection[str] = (),
        above: float | None = None,
    ) -> Solution:
        """:meth:`solve_fresh`, remembered by its inputs when the optimizer has a memo (the
        answer, or the error raised, is the one a fresh solve gives)."""
        memo = self._memo
        if memo is None:
            return self.solve_fresh(speeds, current=current, objective=objective,
                                    restart_penalty=restart_penalty, pinned=pinned, above=above)
        fresh = partial(self.solve_fresh, speeds, current=current, objective=objective,
                        restart_penalty=restart_penalty, pinned=pinned, above=above)
        try:
            key = (tuple([(j, tuple(s.items())) for j, s in speeds.items()]),
                   # a Placement by its fields: its dataclass hash is a Python call
                   tuple([(j, p.start, p.profile) for j, p in current.items()]) if current
                   else (), str(objective),
                   tuple(restart_penalty.items()) if isinstance(restart_penalty, Mapping)
                   else restart_penalty, frozenset(pinned), above)
            got = memo.get(key)
        except (TypeError, AttributeError):  # odd input: no memo (the solve says what is wrong)
            return fresh()
        if got is None:
            try:
                got = (fresh(), None, "")
            except OptimizerError as e:
                got = (None, type(e), str(e))
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[key] = got
        sol, err, msg = got
        if sol is None:
            raise err(msg)  # type: ignore[misc]
        return Solution(sol.layout, dict(sol.assignment), sol.objective, sol.throughput,
                        sol.restarted, sol.kept)

    def try_solve(self, speeds: Mapping[str, Mapping[str, float]], **options: Any
                  ) -> Solution | None:
        """:meth:`solve` with ``options``, or None where it raises :class:`OptimizerError` (no
        layout holds the jobs, or their speeds are invalid): for callers that only fall back."""
        try:
            return self.solve(speeds, **options)
        except OptimizerError:
            return None

    def solve_fresh(
        self,
        speeds: Mapping[str, Mapping[str, float]],
        *,
        current: Mapping[str, Placement] | None = None,
        objective: Objective | str = Objective.THROUGHPUT,
        restart_penalty: float | Mapping[str, float] = 0.1,
        pinned: Collection[str] = (),
        above: float | None = None,
    ) -> Solution:
        """Best layout and assignment for the jobs of ``speeds``.

        ``current`` maps running jobs to their instance now. With the throughput and fairness
        objectives it only breaks ties (fewest restarted jobs); the restart-aware objective
        subtracts ``restart_penalty`` per running job whose instance changes (one value for
        all, or a value per job: the cost of restarting that job). Jobs of ``pinned`` (a
        subset of ``current``) must keep their instance: a hard constraint (jobs that cannot
        checkpoint lose all progress when moved); OptimizerError when no layout keeps them.

        ``above``: raise :class:`Unreachable` (an OptimizerError) at a fraction of the cost of a
        solve when a cheap upper bound shows the objective cannot exceed ``above``.
        """
        if objective is not Objective.THROUGHPUT:
            got = _OBJECTIVES.get(objective) if isinstance(objective, str) else None
            objective = got if got is not None else Objective(objective)
        jobs = list(speeds)
        n = len(jobs)
        if n == 0:
            return Solution((), {}, 0.0, 0.0)
        if n > self.max_jobs:
            raise OptimizerError(f"{n} jobs but {self.geom.model.name} holds at most "
                                 f"{self.max_jobs} instances")
        rows = self.speed_rows(jobs, speeds, log=objective is Objective.FAIRNESS)
        t = self._tables[n]
        small = self._small.get(n)
        vals: np.ndarray | list[float]
        if small is not None:  # one or two jobs: Python lists, numpy's values to the bit
            vals = small.values(rows)
            best_val = max(vals)
            a = vals.index(best_val)  # the first best, as argmax
        else:
            vals = np.add.reduce(np.array(rows, dtype=float).take(t.flat), axis=1)
            a = int(vals.argmax())
            best_val = float(vals[a])
        if best_val <= _NEG / 2:
            raise OptimizerError(self._infeasible_reason(jobs, np.array(rows, dtype=float)))
        cur = {j: current[j] for j in jobs if j in current} if current else {}
        pin = {j: cur[j] for j in pinned if j in cur}
        if objective is Objective.RESTART_AWARE:
            if isinstance(restart_penalty, Mapping):  # asked once: an ABC check is slow
                pen = {j: float(restart_penalty.get(j, 0.0)) for j in cur if j not in pin}
            else:
                pen = dict.fromkeys((j for j in cur if j not in pin),
                                    float(restart_penalty)) if cur else {}
        else:
            pen = dict.fromkeys((j for j in cur if j not in pin), 0.0)
        if above is not None:
            bound = best_val
            if objective is Objective.RESTART_AWARE and pen:
                bound = min(bound, max(self._keep_all(jobs, speeds, cur),
                                       best_val - min(pen.values())))
            # 1e-9: the bound may be summed in another order than the solver's sums.
            if bound + 1e-9 <= above:
                raise Unreachable(f"the objective cannot exceed {above}")
        if pin:
            vals = self._pinned_values(t, small, jobs, vals, pin)
            a = int(vals.argmax()) if small is None else max(range(len(vals)),
                                                             key=vals.__getitem__)
            best_val = float(vals[a])
            if best_val <= _NEG / 2:
                raise OptimizerError(f"no valid {self.geom.model.name} layout keeps the pinned "
                                     f"jobs {', '.join(sorted(pin))} on their instances")
        if not cur:
            # Nothing runs yet, so no restarts to break ties: the first best arrangement wins.
            lay = t.multiset_layouts[t.arr_multiset[a]][0]
            score = best_val
            assignment = dict(zip(jobs, t.default_assign[a], strict=True))
        else:
            # A move costs at most penalty * len(cur), so only arrangements within that margin
            # of the best can win; with no penalty only exact ties remain, broken by restarts.
            margin = sum(pen.values()) + 1e-9
            pin_set = set(pin.values())
            if pin_set:
                # The best arrangement that some layout holding the pinned instances realises.
                order = np.argsort(-vals, kind="stable") if small is None else \
                    sorted(range(len(vals)), key=lambda x: -vals[x])
                for a in order:
                    if vals[a] <= _NEG / 2:
                        break
                    if any(pin_set <= set(lay) for lay in t.multiset_layouts[t.arr_multiset[a]]):
                        best_val = float(vals[a])
                        break
            pick = best_pair(t, self.profile_names, jobs, vals, best_val - margin, cur, pen,
                             pin) if small is None else \
                best_pair_small(small, self._unit, jobs, vals, best_val - margin, cur, pen, pin)
            if pick is None:
                raise OptimizerError(f"no valid {self.geom.model.name} layout keeps the pinned "
                                     f"jobs {', '.join(sorted(pin))} on their instances")
            score, a, lay, placed = pick
            assignment = dict(zip(jobs, placed, strict=True))
        same = [(j, assignment[j] == cur[j]) for j in cur]  # one Placement comparison each
        restarted = tuple(j for j, eq in same if not eq)
        kept_jobs = tuple(j for j, eq in same if eq)
        thr = float(sum(speeds[j][pl.profile] for j, pl in assignment.items()))
        return Solution(lay, assignment, score, thr, restarted, kept_jobs)

    # -- helpers ------------------------------------------------------------------------
    def _keep_all(self, jobs: Sequence[str], speeds: Mapping[str, Mapping[str, float]],
                  cur: Mapping[str, Placement]) -> float:
        """An upper bound of the value of a plan that keeps every running job: their current
        speeds plus the others' best speeds (for one other job: the best on an instance that
        fits beside the running ones); -inf when no instance fits beside them."""
        others = [j for j in jobs if j not in cur]
        keep = sum(speeds[j].get(cur[j].profile, MAX_SPEED) for j in cur)
        if len(others) != 1:
            return keep + sum(max(speeds[j].values()) for j in others)
        room = addable(self.geom, tuple(sorted(cur.values())))
        fits = [s for p, s in speeds[others[0]].items() if p in room]
        return keep + max(fits) if fits else -math.inf

    def _pinned_values(self, t: Tables, small: SmallTables | None, jobs: Sequence[str],
                       vals: np.ndarray | list[float], pin: Mapping[str, Placement]
                       ) -> np.ndarray | list[float]:
        """``vals`` with the arrangements that move a pinned job's profile out (``_NEG``)."""
        want = [(i, self.profile_index[pin[j].profile]) for i, j in enumerate(jobs) if j in pin]
        if small is not None:
            return [v if all(arr[i] == p for i, p in want) else _NEG
                    for arr, v in zip(small.arr, vals, strict=True)]
        mask = np.ones(len(vals), dtype=bool)
        for i, p in want:
            mask &= t.arrangements[:, i] == p
        return np.where(mask, vals, _NEG)

    def _infeasible_reason(self, jobs: Sequence[str], w: np.ndarray) -> str:
        for i, j in enumerate(jobs):
            if np.all(w[i] <= _NEG / 2):
                return f"job {j} fits no MIG profile of {self.geom.model.name}"
        return (f"no valid {self.geom.model.name} layout holds these {len(jobs)} jobs with one "
                f"instance each (memory limits leave too few fitting slices)")


@cache
def optimizer_for(geom: Geometry) -> PartitionOptimizer:
    """A shared, cached optimizer per geometry (the precomputation runs once)."""
    return PartitionOptimizer(geom)


@cache
def remembering_optimizer(geom: Geometry) -> PartitionOptimizer:
    """:func:`optimizer_for`'s optimizer (its tables shared) with a memo of its solutions
    (:class:`PartitionOptimizer`), for questions that repeat."""
    opt = copy.copy(optimizer_for(geom))
    opt._memo = {}
    return opt
