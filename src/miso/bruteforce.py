"""The reference solver: the best objective over all layouts and permutations, deliberately
naive (tests and benchmarks compare :class:`miso.optimize.PartitionOptimizer` with it)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping

from miso.mig.layouts import Geometry, Placement, enumerate_layouts
from miso.optimize import Objective


def brute_force(
    geom: Geometry,
    speeds: Mapping[str, Mapping[str, float]],
    *,
    current: Mapping[str, Placement] | None = None,
    objective: Objective | str = Objective.THROUGHPUT,
    restart_penalty: float | Mapping[str, float] = 0.1,
    pinned: Collection[str] = (),
) -> float:
    """Reference solver: the best objective value over all layouts and all permutations.

    Deliberately naive (tests and benchmarks compare the fast solver with it). Returns -inf when
    no layout holds the jobs.
    """
    objective = Objective(objective)
    jobs = list(speeds)
    n = len(jobs)
    cur = dict(current or {})
    best = -math.inf
    for lay in enumerate_layouts(geom):
        if len(lay) != n:
            continue
        for perm in itertools.permutations(lay):
            total = 0.0
            ok = True
            for j, pl in zip(jobs, perm, strict=True):
                s = speeds[j].get(pl.profile)
                if s is None:
                    ok = False
                    break
                total += math.log(s) if objective is Objective.FAIRNESS else s
            if not ok or any(j in cur and cur[j] != pl
                             for j, pl in zip(jobs, perm, strict=True) if j in pinned):
                continue
            if objective is Objective.RESTART_AWARE:
                for j, pl in zip(jobs, perm, strict=True):
                    if j in cur and cur[j] != pl:
                        total -= (restart_penalty.get(j, 0.0)
                                  if isinstance(restart_penalty, Mapping) else restart_penalty)
            best = max(best, total)
    return best
