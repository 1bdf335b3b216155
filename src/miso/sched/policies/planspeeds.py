"""The speeds miso+ plans each job with: its estimate where it has one (a profile's prediction,
observed rates, or an estimator that needs no profile, such as true speeds or a profile taken
at submission), else a prior (the catalogue average, its harmonic mean in a fixed mix) with
the rates the job has shown so far; switches of issue 19 (off by default: measured no better,
benchmarks/README.md "Predictor") plan toward the low end of the 95 % interval
(``robust_risk``), give prior jobs the curves of catalogue workloads of similar memory
(``memory_prior``) or this cluster's estimates (``cluster_prior``).

Measured (held-out model families, paper setting, ratio of average JCT to true speeds):
``memory_prior`` (the job's own family left out, :mod:`miso.sched.memoryprior`) 1.060 ->
1.049, but the restart-economy 120 s cell at 16 GPUs +0.15 %; ``robust_risk`` 1.027 vs 1.020
(profiles at submission); ``cluster_prior`` (:mod:`miso.sched.clusterprior`) 1.054, and the
busy 40-GPU / 30 s cell worse.

A mixin of :class:`~miso.sched.policies.misoplus.MisoPlus` (it reads the policy's ``est``,
``estimator``, ``learned``, ``batch_prior``, ``robust_risk``, ``memory_prior``,
``cluster_prior`` and :meth:`in_batch`, and records prior-planned jobs in ``prior``).
"""

from __future__ import annotations

from typing import Any

from miso.mig import Geometry
from miso.sched.memoryprior import memory_prior
from miso.sched.modelplace import for_geometry
from miso.sched.policies.base import Scratch
from miso.sched.policies.priors import prior_speeds
from miso.sched.robust import pessimistic


class PlanSpeeds:
    """:meth:`speeds`: per job, its speed on every profile of a GPU, for the optimizer."""

    est: dict[str, dict[str, float]]
    estimator: Any
    learned: dict[str, dict[str, float]]
    prior: set[str]
    batch_prior: bool
    robust_risk: float
    memory_prior: bool
    cluster_prior: Any
    in_batch: Any

    def speeds(self, geom: Geometry, sc: Scratch, jobs: list[str]) -> dict[str, dict[str, float]]:
        out = {}
        for j in jobs:
            if j not in self.est and not self.estimator.needs_profile:
                # Estimates that need no profile (true speeds, a profile taken at submission)
                # are known from the start: no prior.
                self.est[j] = self.estimator.estimate(geom, [sc.state.jobs[j]])[j]
            if j in self.est:  # a job that moved from another GPU model: its speeds here
                self.est[j] = for_geometry(self.est[j], geom)
            if j in self.est and self.cluster_prior is not None:
                self.cluster_prior.add(j, self.est[j])
            if j in self.est:
                out[j] = self.est[j] if not self.robust_risk else pessimistic(
                    self.est[j], getattr(self.estimator, "interval", {}).get(j, {}),
                    sc.state.jobs[j].observed, self.robust_risk)
            else:
                spec = sc.state.jobs[j].spec
                batch = self.batch_prior and self.in_batch()
                out[j] = prior_speeds(geom, spec.memory_gb, harmonic=batch)
                if self.memory_prior and not batch:
                    out[j] = memory_prior(geom, out[j], spec.memory_gb, spec.workload)
                if self.cluster_prior is not None:
                    out[j] = self.cluster_prior.speeds(out[j], geom.model.full_profile().name)
                seen = self.learned.get(j)
                if seen:
                    out[j] = {p: seen.get(p, v) for p, v in out[j].items()}
                self.prior.add(j)
        return out
