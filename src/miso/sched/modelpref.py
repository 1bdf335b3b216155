"""Heterogeneity-aware placement: which GPU model a job should try first (Gavel's idea).

A job's *relative advantage* on a model is its speed there over the average speed of the
catalogue's workloads there (both relative to the same reference model,
:func:`miso.sched.modelspeed.model_factor`): a job goes first where it gains more than the
others do, so the fast model's GPUs go to the jobs that use them best and the others are not
crowded onto it. Models with equal advantage keep their order (GPU order: the blind choice).
A job whose workload is unknown has no advantage anywhere: blind. In the simulator the
workload is known (the factor is the rule's, like the noisy estimator's slice speeds); live, a
job without a catalogue workload is placed blind (not yet from the predictor's answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from miso.mig import Geometry
from miso.sched.modelspeed import model_factor
from miso.workloads import catalogue


@cache
def _mean_factor(model: str) -> float:
    names = sorted(catalogue())
    return sum(model_factor(w, model) for w in names) / len(names)


def advantage(workload: str | None, model: str) -> float:
    """The job's speed on ``model`` over the catalogue's average there (1.0: no advantage)."""
    if workload is None or workload not in catalogue():
        return 1.0
    return model_factor(workload, model) / _mean_factor(model)


def model_order(workload: str | None, geoms: Sequence[Geometry]) -> list[Geometry]:
    """``geoms`` by the job's relative advantage, highest first (stable)."""
    return sorted(geoms, key=lambda g: -advantage(workload, g.model.name))
