"""The speeds miso+ plans each job with: its estimate where it has one (a profile's prediction,
observed rates, or an estimator that needs no profile, such as true speeds or a profile taken
at submission), else a prior (the catalogue average, its harmonic mean in a fixed mix) with
the rates the job has shown so far; then the profile's estimate plugins
(:mod:`~miso.sched.policies.estimates`; none shipped, issue 19's experiments are in
:mod:`miso.sched.experiments`).

A mixin of :class:`~miso.sched.policies.misoplus.MisoPlus` (it reads the policy's ``est``,
``estimator``, ``learned``, ``batch_prior``, ``estimates`` and :meth:`in_batch`, and records
prior-planned jobs in ``prior``).
"""

from __future__ import annotations

from typing import Any

from miso.mig import Geometry
from miso.sched.modelplace import for_geometry
from miso.sched.policies.base import Scratch
from miso.sched.policies.estimates import SpeedPlugin
from miso.sched.policies.priors import prior_speeds


class PlanSpeeds:
    """:meth:`speeds`: per job, its speed on every profile of a GPU, for the optimizer."""

    est: dict[str, dict[str, float]]
    estimator: Any
    learned: dict[str, dict[str, float]]
    prior: set[str]
    batch_prior: bool
    estimates: tuple[SpeedPlugin, ...]
    in_batch: Any

    def speeds(self, geom: Geometry, sc: Scratch, jobs: list[str]) -> dict[str, dict[str, float]]:
        out = {}
        batch: bool | None = None  # in_batch() once per call: it cannot change meanwhile
        for j in jobs:
            if j not in self.est and not self.estimator.needs_profile:
                # Estimates that need no profile (true speeds, a profile taken at submission)
                # are known from the start: no prior.
                self.est[j] = self.estimator.estimate(geom, [sc.state.jobs[j]])[j]
            if j in self.est:  # a job that moved from another GPU model: its speeds here
                self.est[j] = for_geometry(self.est[j], geom)
            if j in self.est:
                out[j] = self.est[j]
                for p in self.estimates:
                    out[j] = p.known(self, sc, j, self.est[j], out[j])  # type: ignore[arg-type]
            else:
                if batch is None:
                    batch = bool(self.batch_prior and self.in_batch())
                out[j] = prior_speeds(geom, sc.state.jobs[j].spec.memory_gb, harmonic=batch)
                for p in self.estimates:
                    out[j] = p.prior(self, sc, geom, j, out[j], batch)  # type: ignore[arg-type]
                seen = self.learned.get(j)
                if seen:
                    out[j] = {p: seen.get(p, v) for p, v in out[j].items()}
                self.prior.add(j)
        return out
