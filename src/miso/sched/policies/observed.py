"""miso+'s reading of measured speeds: profiles (levels not measured imputed for the
learned predictor), observed MIG rates replacing predictions or the prior, and phase changes
(a job alone is re-profiled alone; on a shared GPU its estimates are rescaled instead of
stopping the residents).

The profile's estimate plugins (:mod:`~miso.sched.policies.estimates`) hear of every rate
(none shipped; issue 19's ``PropagateObserved``, ``AnchorSlices``, ``LearnEarlierSlices`` are
in :mod:`miso.sched.experiments`).

A learner of :class:`~miso.sched.policies.misoplus.MisoPlus`: functions its speed-event hooks
call with the policy ``pol`` (no state or options of their own; they read and update ``pol``'s
``est``, ``base_est``, ``ref_rate``, ``learned``, ``ran``, ``last_profile``, MISO's knobs
``threshold`` and ``cooldown``, its ``estimates``, ``estimator`` and ``replan``). The
``observed_correction`` switch, off only in an ablation, was deleted in issue 27: observed rates
always correct the estimates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from miso.sched.estimators import PredictorEstimator, clip_speed
from miso.sched.events import MPS_LEVELS, JobSpeedChanged, ProfilingFinished, SpeedObserved
from miso.sched.policies.base import Scratch

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.misoplus import MisoPlus


def on_profiled(pol: MisoPlus, ev: ProfilingFinished) -> ProfilingFinished:
    """A profile: its jobs have run; the event with every MPS level (the ones not
    measured imputed for the learned predictor), for MISO's reading of it."""
    pol.ran.update(ev.speeds)
    if tuple(ev.levels) != MPS_LEVELS and ev.speeds and isinstance(
            pol.estimator, PredictorEstimator):
        # The learned predictor reads all three levels: impute the ones not measured.
        from miso.predict.levels import impute_profile

        ev = ProfilingFinished(ev.gpu, ev.plan_id, {
            j: impute_profile(tuple(ev.levels), v) for j, v in ev.speeds.items()},
            MPS_LEVELS)
    return ev


def on_speed_observed(pol: MisoPlus, ev: SpeedObserved, sc: Scratch) -> None:
    """A measured rate: on the whole GPU, the job's reference rate; with one, the job's
    estimates replaced by its observed rates over it (the estimate plugins told, with
    the estimates before), else, for a job planned with the prior, its speed there."""
    gs = sc.state.gpus.get(ev.gpu)
    if gs is None:
        return
    full = gs.geom.model.full_profile().name
    if ev.placement.profile == full:  # a rate on the whole GPU: the job's reference rate
        pol.ref_rate[ev.job] = ev.rate
    for p in pol.estimates:
        p.rate(pol, sc, ev, full)
    ref = pol.ref_rate.get(ev.job)
    if ref and ev.job in pol.est:
        est = pol.est[ev.job]
        before = dict(est)
        est.update({p: clip_speed(r / ref) for p, r in sc.state.jobs[ev.job].observed.items()
                    if p in est})
        for p in pol.estimates:
            p.corrected(pol, sc, ev.job, gs.geom, full, before)
    elif ref and ev.placement.profile != full:
        pol.learned.setdefault(ev.job, {})[ev.placement.profile] = clip_speed(ev.rate / ref)


def on_speed_changed(pol: MisoPlus, now: float, ev: JobSpeedChanged, sc: Scratch) -> None:
    """A phase change: a job alone is re-profiled alone; on a shared GPU its estimates are
    rescaled by observed/baseline and the GPU re-planned (outside a burst)."""
    if ev.baseline <= 0 or abs(ev.observed / ev.baseline - 1.0) <= pol.threshold:
        return
    jobs = sc.jobs_on(ev.gpu) if ev.gpu in sc.state.gpus else []
    recent = now - pol.last_profile.get(ev.gpu, -1e18) < pol.cooldown
    if jobs == [ev.job] and sc.state.jobs[ev.job].spec.checkpointable and not recent:
        pol.est.pop(ev.job, None)    # alone: re-profile it alone, nobody else stops
        pol.ref_rate.pop(ev.job, None)
        pol.ran.discard(ev.job)
        pol.replan(now, ev.gpu, sc)
        return
    # Shared GPU: rescale instead of stopping the residents (relative speeds keep shape).
    f = ev.observed / ev.baseline
    if ev.job in pol.est:
        full = sc.state.gpus[ev.gpu].geom.model.full_profile().name
        base = pol.base_est.setdefault(ev.job, dict(pol.est[ev.job]))
        pol.est[ev.job] = {p: v if p == full else clip_speed(v * f) for p, v in base.items()}
    pol.dirty.add(ev.gpu)
    if not pol.bursts.burst(sc):  # a burst's landing layout stays: the next event re-plans
        pol.replan(now, ev.gpu, sc)

