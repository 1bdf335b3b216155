"""Whether a mix of jobs has a layout on a GPU, remembered by the mix's structure.

miso+'s placement pass asks, for every queued job and candidate GPU, whether a layout keeps the
GPU's pinned residents on their instances and holds the job too (issue 32: 1.45M questions and
203k solves at 1,024 GPUs). Its queue holds few memory classes, so the same structure recurs:
an answer kept per structure turns most questions into a dict lookup.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import cache

from miso.mig.layouts import Geometry, Placement
from miso.optimize import PartitionOptimizer, optimizer_for, valid_speed

#: Answers a memo keeps before it starts afresh.
HOLDS_SIZE = 65536


class FeasibilityMemo:
    """The answers of one optimizer's feasibility question (:meth:`holds`)."""

    def __init__(self, opt: PartitionOptimizer) -> None:
        self.opt = opt
        self.answers: dict[tuple[tuple[int, int, str], ...], bool] = {}

    def holds(self, speeds: Mapping[str, Mapping[str, float]], *,
              current: Mapping[str, Placement] | None = None, pinned: Collection[str] = ()
              ) -> bool:
        """Whether :meth:`PartitionOptimizer.try_solve` (throughput objective) finds a layout,
        remembered by the mix's structure: per job the profiles it has a speed on and, if
        pinned, its instance. Valid speeds sum far above the infeasible mark, a pinned job's
        instance is the only constraint, and unpinned jobs' instances only break ties, so the
        speed values, the order of the jobs and where the unpinned ones run change no answer.
        A row with a bad profile or speed is not remembered."""
        opt, index, memo = self.opt, self.opt.profile_index, self.answers
        pin = {j: current[j] for j in pinned if j in current and j in speeds} if current else {}
        entries = []
        for j, row in speeds.items():
            mask = 0
            for prof, s in row.items():
                i = index.get(prof)
                if i is None or not valid_speed(s):
                    return opt.try_solve(speeds, current=current, pinned=pinned) is not None
                mask |= 1 << i
            pl = pin.get(j)
            entries.append((mask, -1, "") if pl is None else (mask, pl.start, pl.profile))
        key = tuple(sorted(entries))
        got = memo.get(key)
        if got is None:
            got = opt.try_solve(speeds, current=current, pinned=pinned) is not None
            if len(memo) >= HOLDS_SIZE:
                memo.clear()
            memo[key] = got
        return got


@cache
def feasibility_for(geom: Geometry) -> FeasibilityMemo:
    """A shared memo per geometry over :func:`~miso.optimize.optimizer_for`'s optimizer."""
    return FeasibilityMemo(optimizer_for(geom))
