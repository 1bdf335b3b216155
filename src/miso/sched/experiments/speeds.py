"""Issue 19's estimate experiments as plugins (:mod:`miso.sched.policies.estimates`), off the
shipped profile: each measured no better on held-out model families or worse on the
restart-economy cells (benchmarks/README.md, "Predictor").

Measured (held-out model families, paper setting, ratio of average JCT to true speeds):
:class:`MemoryPrior` (the job's own family left out, :mod:`miso.sched.memoryprior`) 1.060 ->
1.049, but the restart-economy 120 s cell at 16 GPUs +0.15 %; :class:`RobustRisk` 1.027 vs
1.020 (profiles at submission); :class:`ClusterPriorPlugin` (:mod:`miso.sched.clusterprior`)
1.054, and the busy 40-GPU / 30 s cell worse; :class:`LearnEarlierSlices` 1.060 -> 1.052,
but the restart-economy 120 s cells +0.1 %.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from miso.mig import Geometry
from miso.sched.clusterprior import ClusterPrior
from miso.sched.estimators import clip_speed
from miso.sched.memoryprior import memory_prior
from miso.sched.policies.estimates import SpeedPlugin
from miso.sched.robust import anchored_full_rate, pessimistic, propagate

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.events import SpeedObserved
    from miso.sched.policies.base import Scratch
    from miso.sched.policies.misoplus import MisoPlus


@dataclass(frozen=True)
class RobustRisk(SpeedPlugin):
    """Plan toward the low end of the 95 % interval: speeds moved ``risk`` of the way down
    (:func:`~miso.sched.robust.pessimistic`)."""

    risk: float = 0.5
    name: ClassVar[str] = "robust_risk"

    def known(self, pol: MisoPlus, sc: Scratch, job: str, est: dict[str, float],
              speeds: dict[str, float]) -> dict[str, float]:
        if not self.risk:
            return speeds
        intervals = getattr(pol.estimator, "interval", {})
        return pessimistic(speeds, intervals.get(job, {}), sc.state.jobs[job].observed,
                           self.risk)


@dataclass(frozen=True)
class MemoryPrior(SpeedPlugin):
    """Jobs without an estimate get the slice curve of catalogue workloads of similar memory
    (:func:`~miso.sched.memoryprior.memory_prior`), outside a fixed mix."""

    name: ClassVar[str] = "memory_prior"

    def prior(self, pol: MisoPlus, sc: Scratch, geom: Geometry, job: str,
              speeds: dict[str, float], batch: bool) -> dict[str, float]:
        if batch:
            return speeds
        spec = sc.state.jobs[job].spec
        return memory_prior(geom, speeds, spec.memory_gb, spec.workload)


@dataclass(frozen=True)
class ClusterPriorPlugin(SpeedPlugin):
    """Jobs without an estimate get this cluster's harmonic-mean speeds
    (:class:`~miso.sched.clusterprior.ClusterPrior`) where enough jobs have estimates."""

    min_jobs: int = 5
    name: ClassVar[str] = "cluster_prior"
    seen: ClusterPrior | None = field(default=None, compare=False)

    def build(self) -> ClusterPriorPlugin:
        return ClusterPriorPlugin(self.min_jobs, ClusterPrior(self.min_jobs))

    def known(self, pol: MisoPlus, sc: Scratch, job: str, est: dict[str, float],
              speeds: dict[str, float]) -> dict[str, float]:
        assert self.seen is not None, "build() it first"
        self.seen.add(job, est)
        return speeds

    def prior(self, pol: MisoPlus, sc: Scratch, geom: Geometry, job: str,
              speeds: dict[str, float], batch: bool) -> dict[str, float]:
        assert self.seen is not None, "build() it first"
        return self.seen.speeds(speeds, geom.model.full_profile().name)


@dataclass(frozen=True)
class PropagateObserved(SpeedPlugin):
    """After a measured slice, move a job's other slices through the predictor's cross-slice
    error correlation, from its estimate before any measurement
    (:func:`~miso.sched.robust.propagate`)."""

    name: ClassVar[str] = "propagate_observed"
    predicted: dict[str, dict[str, float]] | None = field(default=None, compare=False)

    def build(self) -> PropagateObserved:
        return PropagateObserved({})

    def corrected(self, pol: MisoPlus, sc: Scratch, job: str, geom: Geometry, full: str,
                  before: dict[str, float]) -> None:
        assert self.predicted is not None, "build() it first"
        self.predicted.setdefault(job, before)  # its estimate before any measurement
        est, obs = pol.est, sc.state.jobs[job].observed
        est[job] = propagate(geom, self.predicted[job], {
            p: est[job][p] for p in obs if p in est[job] and p != full},
            getattr(pol.estimator, "calibration", None))

    def forget(self, job: str) -> None:
        if self.predicted is not None:
            self.predicted.pop(job, None)


@dataclass(frozen=True)
class AnchorSlices(SpeedPlugin):
    """A job with an estimate but no full-GPU rate gets one anchored on its first slice
    (:func:`~miso.sched.robust.anchored_full_rate`)."""

    name: ClassVar[str] = "anchor_slices"

    def rate(self, pol: MisoPlus, sc: Scratch, ev: SpeedObserved, full: str) -> None:
        if ev.job not in pol.ref_rate and ev.placement.profile in pol.est.get(ev.job, {}):
            pol.ref_rate[ev.job] = anchored_full_rate(
                ev.rate, pol.est[ev.job][ev.placement.profile])


@dataclass(frozen=True)
class LearnEarlierSlices(SpeedPlugin):
    """Once a job planned with the prior has a full-GPU rate, the rates it showed on earlier
    slices become its speeds there (:func:`earlier_slice_speeds`)."""

    name: ClassVar[str] = "learn_earlier_slices"

    def rate(self, pol: MisoPlus, sc: Scratch, ev: SpeedObserved, full: str) -> None:
        if ev.placement.profile == full and ev.job not in pol.est:
            pol.learned[ev.job] = {**earlier_slice_speeds(
                sc.state.jobs[ev.job].observed, ev.rate, full),
                **pol.learned.get(ev.job, {})}


def earlier_slice_speeds(observed: dict[str, float], full_rate: float, full: str
                         ) -> dict[str, float]:
    """Speeds of the slices a job ran on before its full-GPU rate was known: each slice's
    first raw rate (``observed``, profile -> rate) over the full-GPU rate, clipped as every
    observed speed is. A job planned with the prior that reaches a whole GPU (rebalanced onto
    an idle one, or alone after its neighbours left) is then planned with the speed it really
    had on its slice, not the catalogue's, when it next shares (issue 19, item 4)."""
    if full_rate <= 0:
        return {}
    return {p: clip_speed(r / full_rate) for p, r in observed.items()
            if p != full and r > 0}
