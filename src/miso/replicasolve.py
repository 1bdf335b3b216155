"""Exact per-GPU solve for training jobs beside pinned service replicas.

Services come first on a shared GPU: a replica keeps its instance (the service planner resizes
it make-before-break), and the training jobs get the best layout around it. This wraps the
partition optimizer (:mod:`miso.optimize`) with replicas as pinned pseudo-jobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from miso.mig.layouts import Placement
from miso.optimize import OptimizerError, PartitionOptimizer, Solution

#: The speed a service replica counts for inside :func:`solve_beside_replicas`: positive (the
#: optimizer's input rule) and small enough never to change which jobs' arrangement wins.
REPLICA_SPEED = 1e-9


def solve_beside_replicas(
    opt: PartitionOptimizer,
    speeds: Mapping[str, Mapping[str, float]],
    replicas: Mapping[str, Placement],
    *,
    current: Mapping[str, Placement] | None = None,
    **kw: object,
) -> Solution:
    """Services first, exact per GPU: the best layout for the training jobs of ``speeds``
    beside the service replicas ``replicas`` (id -> instance), each of which keeps its
    instance (a replica is resized make-before-break by the service planner, never moved by
    the training optimizer). The replicas are pinned pseudo-jobs whose only profile is their
    own; the returned assignment holds the training jobs only, the layout every instance."""
    clash = set(replicas) & set(speeds)
    if clash:
        raise OptimizerError(f"ids are both jobs and replicas: {', '.join(sorted(clash))}")
    allspeeds: dict[str, Mapping[str, float]] = dict(speeds)
    for rid, pl in replicas.items():
        allspeeds[rid] = {pl.profile: REPLICA_SPEED}
    cur = dict(current or {})
    cur.update(replicas)
    pinned = set(kw.pop("pinned", ()) or ()) | set(replicas)  # type: ignore[call-overload]
    sol = opt.solve(allspeeds, current=cur, pinned=pinned, **kw)  # type: ignore[arg-type]
    jobs_only = {j: pl for j, pl in sol.assignment.items() if j not in replicas}
    thr = float(sum(speeds[j][pl.profile] for j, pl in jobs_only.items()))
    return Solution(sol.layout, jobs_only, sol.objective, thr,
                    tuple(j for j in sol.restarted if j not in replicas),
                    tuple(j for j in sol.kept if j not in replicas))
