"""miso+'s reading of measured speeds: profiles (levels not measured imputed for the
learned predictor), observed MIG rates replacing predictions or the prior, and phase changes
(a job alone is re-profiled alone; on a shared GPU its estimates are rescaled instead of
stopping the residents).

The profile's estimate plugins (:mod:`~miso.sched.policies.estimates`) hear of every rate
(none shipped; issue 19's ``PropagateObserved``, ``AnchorSlices``, ``LearnEarlierSlices`` are
in :mod:`miso.sched.experiments`).

A mixin of :class:`~miso.sched.policies.misoplus.MisoPlus` (it reads and updates the policy's
``est``, ``base_est``, ``ref_rate``, ``learned``, ``ran``, ``last_profile``, its knobs
``observed_correction``, ``threshold``, ``cooldown``, its ``estimates``, ``estimator`` and
``replan``).
"""

from __future__ import annotations

from typing import Any

from miso.sched.estimators import PredictorEstimator
from miso.sched.events import MPS_LEVELS, JobSpeedChanged, ProfilingFinished, SpeedObserved
from miso.sched.policies.base import Scratch
from miso.sched.policies.estimates import SpeedPlugin


class ObservedSpeeds:
    """Speed events (see the module docstring)."""

    est: dict[str, dict[str, float]]
    base_est: dict[str, dict[str, float]]
    ref_rate: dict[str, float]
    learned: dict[str, dict[str, float]]
    ran: set[str]
    last_profile: dict[str, float]
    observed_correction: bool
    estimates: tuple[SpeedPlugin, ...]
    threshold: float
    cooldown: float
    estimator: Any
    dirty: set[str]
    replan: Any
    burst: Any

    def on_profiled(self, now: float, ev: ProfilingFinished, sc: Scratch) -> None:
        self.ran.update(ev.speeds)
        if tuple(ev.levels) != MPS_LEVELS and ev.speeds and isinstance(
                self.estimator, PredictorEstimator):
            # The learned predictor reads all three levels: impute the ones not measured.
            from miso.predict.levels import impute_profile

            ev = ProfilingFinished(ev.gpu, ev.plan_id, {
                j: impute_profile(tuple(ev.levels), v) for j, v in ev.speeds.items()},
                MPS_LEVELS)
        super().on_profiled(now, ev, sc)  # type: ignore[misc]

    def on_speed_observed(self, now: float, ev: SpeedObserved, sc: Scratch) -> None:
        if not self.observed_correction:
            return
        gs = sc.state.gpus.get(ev.gpu)
        if gs is None:
            return
        full = gs.geom.model.full_profile().name
        if ev.placement.profile == full:
            self.note_full_rate(ev, full, sc)
        for p in self.estimates:
            p.slice_rate(self, sc, ev)  # type: ignore[arg-type]
        ref = self.ref_rate.get(ev.job)
        if ref and ev.job not in self.est and ev.placement.profile != full:
            self.learned.setdefault(ev.job, {})[ev.placement.profile] = \
                max(0.01, min(1.5, ev.rate / ref))
        if ref and ev.job in self.est:
            self.correct_estimates(ev.job, ref, gs.geom, full, sc)

    def note_full_rate(self, ev: SpeedObserved, full: str, sc: Scratch) -> None:
        """A rate measured on the whole GPU: the job's reference rate."""
        self.ref_rate[ev.job] = ev.rate
        for p in self.estimates:
            p.full_rate(self, sc, ev, full)  # type: ignore[arg-type]

    def correct_estimates(self, job: str, ref: float, geom: Any, full: str,
                          sc: Scratch) -> None:
        """Replace ``job``'s estimates by its observed rates over its full-GPU rate."""
        for p in self.estimates:
            p.correcting(self, job)  # type: ignore[arg-type]
        obs = sc.state.jobs[job].observed
        for prof, r in obs.items():
            if prof in self.est[job]:
                self.est[job][prof] = max(0.01, min(1.5, r / ref))
        for p in self.estimates:
            p.corrected(self, sc, job, geom, full)  # type: ignore[arg-type]

    def on_speed_changed(self, now: float, ev: JobSpeedChanged, sc: Scratch) -> None:
        if ev.baseline <= 0 or abs(ev.observed / ev.baseline - 1.0) <= self.threshold:
            return
        jobs = sc.jobs_on(ev.gpu) if ev.gpu in sc.state.gpus else []
        recent = now - self.last_profile.get(ev.gpu, -1e18) < self.cooldown
        if jobs == [ev.job] and sc.state.jobs[ev.job].spec.checkpointable and not recent:
            self.est.pop(ev.job, None)    # alone: re-profile it alone, nobody else stops
            self.ref_rate.pop(ev.job, None)
            self.ran.discard(ev.job)
            self.replan(now, ev.gpu, sc)
            return
        # Shared GPU: rescale instead of stopping the residents (relative speeds keep shape).
        f = ev.observed / ev.baseline
        if ev.job in self.est:
            full = sc.state.gpus[ev.gpu].geom.model.full_profile().name
            base = self.base_est.setdefault(ev.job, dict(self.est[ev.job]))
            self.est[ev.job] = {p: (v if p == full else max(0.01, min(1.5, v * f)))
                                for p, v in base.items()}
        self.dirty.add(ev.gpu)
        if not self.burst():  # a burst's landing layout stays: the next event re-plans
            self.replan(now, ev.gpu, sc)

