"""Explanation records of scheduling decisions, and their text in words and numbers.

:func:`explain` turns one decision of the core (right after ``state.apply``) into a plain JSON
record: what was decided, what triggered it, the mix and its predicted speeds (and std), the
chosen layout and assignment with its objective, the current layout's objective for the same
jobs, the jobs it restarts and the expected gain. It prefers the policy's own ``why`` (see
:mod:`miso.sched.decisions`) and falls back to what the decision and the state show, with
speeds from an optional estimate table (the policy's). The record in words:
:func:`miso.observe.decisionwords.describe`. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from miso.observe.decisionwords import timer_words
from miso.sched import (
    ApplyLayout,
    ClusterState,
    Decision,
    Event,
    GpuAdded,
    GpuRemoved,
    JobFailed,
    JobFinished,
    JobSpeedChanged,
    JobSubmitted,
    LayoutApplied,
    LayoutFailed,
    PlaceJob,
    ProfilingFinished,
    RequeueCause,
    RequeueJob,
    RunMps,
    SpeedObserved,
    StartProfiling,
    Tick,
    WakeUp,
)
from miso.sched.decisions import (
    HoldGpu,
    ReleaseGpu,
    RepartitionDeclined,
    StartGang,
    StopGang,
)
from miso.sched.events import profiling_run_order

Speeds = Mapping[str, Mapping[str, float]]

#: What kind of event triggered a decision, as the ``trigger`` field names it.
TRIGGERS: dict[type, str] = {
    JobSubmitted: "arrival", JobFinished: "completion", JobFailed: "completion",
    ProfilingFinished: "profiled", JobSpeedChanged: "speed_change",
    SpeedObserved: "observed", GpuAdded: "node_change", GpuRemoved: "node_change",
    LayoutApplied: "applied", LayoutFailed: "failure", Tick: "timer",
}


def trigger_of(ev: Event | None) -> tuple[str, dict[str, Any]]:
    """(trigger name, {"event": type, "job"/"gpu": ...}) of the event being handled."""
    if ev is None:
        return "unknown", {}
    cause: dict[str, Any] = {"event": type(ev).__name__}
    job = getattr(ev, "job", None)
    if job is not None:
        cause["job"] = job if isinstance(job, str) else job.id
    gpu = getattr(ev, "gpu", None)
    if gpu is not None:
        cause["gpu"] = gpu
    if isinstance(ev, (JobFailed, LayoutFailed)):
        cause["reason"] = ev.reason
    if isinstance(ev, Tick):
        cause["tag"] = ev.tag
    if isinstance(ev, ProfilingFinished):
        cause["jobs"] = list(ev.speeds)
        # what the run measured: each job's rate (it/s) with the mix at the highest level
        top = max(range(len(ev.levels)), key=lambda i: ev.levels[i]) if ev.levels else None
        cause["measured"] = {j: round(float(r[top]), 4) for j, r in ev.speeds.items()
                             if top is not None and len(r) > top}
        cause["measured_level"] = ev.levels[top] if top is not None else None
    return TRIGGERS.get(type(ev), type(ev).__name__), cause


@dataclass
class Context:
    """What the explainer knows besides the decision and the state.

    ``event``: the event whose handling produced the decision; ``restarted``: jobs the decision
    restarted (from the state's restart counters); ``speeds``: predicted speeds (the policy's
    estimates) when the decision carries none; ``origin``: words on what started the chain
    (e.g. the arrival that led to the profiling run this layout follows); ``gpu_before``: the
    GPU a requeued job was on.
    """

    event: Event | None = None
    restarted: list[str] = field(default_factory=list)
    speeds: Speeds | None = None
    origin: str | None = None
    gpu_before: str | None = None


def _fmt(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def _objective(assignment: Mapping[str, Any], speeds: Speeds) -> float | None:
    """Sum of predicted speeds of an assignment (None when a speed is unknown)."""
    tot = 0.0
    for j, pl in assignment.items():
        s = speeds.get(j, {}).get(pl.profile)
        if s is None:
            return None
        tot += s
    return tot


def explain(now: float, d: Decision, state: ClusterState, ctx: Context) -> dict[str, Any]:
    """The explanation record of ``d`` (called right after ``state.apply(now, d)``)."""
    trig, cause = trigger_of(ctx.event)
    rec: dict[str, Any] = {"time": round(now, 3), "kind": type(d).__name__, "trigger": trig,
                           "cause": cause}
    if ctx.origin:
        rec["origin"] = ctx.origin
    why = getattr(d, "why", None)
    match d:
        case ApplyLayout():
            rec.update(_apply_layout(d, state, ctx))
        case StartProfiling():
            rec.update(gpu=d.gpu, plan_id=d.plan_id, jobs=list(d.jobs), levels=list(d.levels),
                       seconds_per_level=d.seconds_per_level, restarts=list(ctx.restarted))
            unknown = [j for j in d.jobs if not (ctx.speeds and j in ctx.speeds)]
            rec["note"] = (f"speeds of {_jobs_words(unknown or list(d.jobs))} unknown: profile "
                           f"the mix of {len(d.jobs)} jobs under MPS at "
                           f"{'/'.join(map(str, profiling_run_order(d.levels)))} % "
                           f"(run order) for "
                           f"{len(d.levels)} x {d.seconds_per_level:g} s")
        case RunMps():
            rec.update(gpu=d.gpu, plan_id=d.plan_id, jobs=sorted(d.shares),
                       shares=dict(d.shares), restarts=list(ctx.restarted),
                       note="share the full GPU under MPS: "
                       + ", ".join(f"{j} {s} %" for j, s in sorted(d.shares.items())))
        case PlaceJob():
            gs = state.gpus.get(d.gpu)
            js = state.jobs.get(d.job)
            rec.update(job=d.job, gpu=d.gpu)
            if gs is not None and js is not None:
                cap = gs.geom.model.full_profile().memory_gib
                used = state.memory_used(d.gpu)
                rec.update(resident=list(gs.jobs), memory_gb=js.spec.memory_gb,
                           memory_used_gb=round(used, 3), memory_total_gb=cap,
                           queue_after=len(state.queue))
                others = [j for j in gs.jobs if j != d.job]
                rec["note"] = (f"job {d.job} ({js.spec.memory_gb:.1f} GB) goes to {d.gpu}, "
                               f"which held {len(others)} job{'s' if len(others) != 1 else ''} "
                               f"(least crowded GPU that fits it; {used:.1f} of {cap:g} GiB "
                               f"now used)")
            if isinstance(why, Mapping) and why.get("order"):
                # what priority or fair share changed in the order (owners and counts only)
                rec["note"] = f"{rec.get('note') or f'job {d.job} goes to {d.gpu}'}; " \
                    f"{why['order']}"
        case RequeueJob():
            rec.update(job=d.job, gpu=ctx.gpu_before, reason=d.reason,
                       restarts=list(ctx.restarted))
            if d.cause is RequeueCause.REBALANCE:
                rec["trigger"] = "rebalance"
            rec["note"] = f"job {d.job} back to the queue: {d.reason or 'no reason given'}"
        case StartGang() | StopGang():
            # a job on several whole GPUs (miso.sched.gangs): started all together, or stopped
            rec.update(job=d.job, gpus=list(getattr(d, "gpus", ())),
                       plan_id=getattr(d, "plan_id", None),
                       note=f"job {d.job} " + (f"starts on {len(d.gpus)} whole GPU(s)"
                                               if isinstance(d, StartGang)
                                               else f"stops on every GPU: {d.reason}"))
        case HoldGpu() | ReleaseGpu():
            rec.update(gpu=d.gpu, note=f"{d.gpu} " + ("held for a gang's reservation"
                                                      if isinstance(d, HoldGpu)
                                                      else "back to the policy"))
        case RepartitionDeclined():
            # a record, not an action: the repartition given up, its gain and restart price
            rec.update(gpu=d.gpu, jobs=list(d.restarts), would_restart=list(d.restarts),
                       gain=_fmt(d.gain), restart_price=_fmt(d.price))
            if d.job:
                rec["job"] = d.job
        case WakeUp():
            rec.update(at=round(d.at, 3), tag=d.tag,
                       note=f"{timer_words(d.tag)} at t={d.at:.1f}s")
        case _:
            rec["note"] = repr(d)
    if isinstance(why, Mapping):
        mine = rec.get("note")
        for k, v in why.items():
            if k in ("speeds", "std") and k in rec:
                continue  # already copied (rounded) from the same ``why``
            if v is not None or k not in rec:
                rec[k] = _plain(v)
        if mine and rec.get("note") != mine and isinstance(d, ApplyLayout):
            rec["detail"] = mine  # the numbers in words, beside the policy's own note
    if isinstance(rec.get("note"), str) and NOTHING_RAN in rec["note"] and (
            rec.get("current_layout") or trig == "profiled" or ctx.restarted):
        # the policy had no comparable total, but jobs did run here before this plan
        rec["note"] = rec["note"].replace(
            NOTHING_RAN, "(its jobs ran under MPS to be profiled)" if trig == "profiled"
            else "(no total to compare: the GPU's mix changed)")
    return rec


#: The policy's words for a plan with no current total (see ``sched.policies.explain``).
NOTHING_RAN = "(nothing ran before)"


def _apply_layout(d: ApplyLayout, state: ClusterState, ctx: Context) -> dict[str, Any]:
    gs = state.gpus.get(d.gpu)
    cur_asg = dict(gs.assignment) if gs is not None else {}
    cur_layout = list(gs.layout) if gs is not None else []
    jobs = sorted(d.assignment, key=job_key)
    out: dict[str, Any] = {
        "gpu": d.gpu, "plan_id": d.plan_id, "jobs": jobs,
        "layout": [str(p) for p in sorted(d.layout)],
        "assignment": {j: str(d.assignment[j]) for j in jobs},
        "current_layout": [str(p) for p in sorted(cur_layout)],
        "current_assignment": {j: str(p) for j, p in sorted(cur_asg.items())},
        "restarts": list(ctx.restarted),
    }
    why = getattr(d, "why", None) or {}
    speeds: Speeds | None = why.get("speeds") or (
        {j: dict(ctx.speeds[j]) for j in jobs if j in ctx.speeds} if ctx.speeds else None)
    if speeds:
        out["speeds"] = {j: {p: _fmt(s) for p, s in sorted(speeds[j].items())}
                         for j in jobs if j in speeds}
        obj = _objective(d.assignment, speeds)
        kept = {j: pl for j, pl in cur_asg.items() if j in d.assignment}
        cur = _objective(kept, speeds) if kept else None
        out["objective"] = _fmt(obj)
        out["current_objective"] = _fmt(cur)
        out["expected_gain"] = _fmt(obj - cur) if obj is not None and cur is not None else None
    else:
        out.update(objective=None, current_objective=None, expected_gain=None)
    moved = [j for j in jobs if j in cur_asg and cur_asg[j] != d.assignment[j]]
    new = [j for j in jobs if j not in cur_asg]
    words = []
    if out.get("objective") is not None:
        words.append(f"maximises the total predicted speed of the {len(jobs)} job"
                     f"{'s' if len(jobs) != 1 else ''} among the valid layouts "
                     f"({out['objective']:.3f}")
        if out.get("current_objective") is not None:
            words[-1] += (f" vs {out['current_objective']:.3f} for the current layout, gain "
                          f"{out['expected_gain']:+.3f})")
        elif ctx.event is not None and isinstance(ctx.event, ProfilingFinished):
            words[-1] += "; until now they ran together under MPS to be profiled)"
        else:
            words[-1] += "; the current layout runs none of them)"
    elif len(jobs) == 1:
        words.append(f"job {jobs[0]} is alone on the GPU: the full slice is best")
    if new:
        words.append(f"starts {_jobs_words(new)}")
    if moved:
        words.append(f"moves {_jobs_words(moved)} (checkpoint and restart)")
    out["note"] = "; ".join(words) if words else "layout change"
    std = why.get("std")
    if isinstance(std, Mapping):
        out["std"] = {j: {p: _fmt(e) for p, e in sorted(std[j].items())} for j in jobs
                      if j in std}
    return out


#: A user id as :mod:`miso.api.users` hands them out (``u:`` and 64 random bits in hex).
_USER_ID = re.compile(r"\bu:[0-9a-f]{16}\b")


def name_owners(rec: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """``rec`` with every user id in its text fields (``note``, ``order``, ``detail``, ...)
    replaced by the user's name (an id without a known name stays): users read names."""
    if not names:
        return rec
    for k, v in rec.items():
        if isinstance(v, str) and "u:" in v:
            rec[k] = _USER_ID.sub(lambda m: names.get(m.group(0), m.group(0)), v)
    return rec


def job_key(j: str) -> tuple[int, int | str]:
    """Natural order of job ids ("2" before "10")."""
    return (0, int(j)) if j.isdigit() else (1, j)


def _jobs_words(jobs: list[str]) -> str:
    if not jobs:
        return "no job"
    return ("job " if len(jobs) == 1 else "jobs ") + ", ".join(jobs)


def _plain(v: Any) -> Any:
    """JSON-ready copy of a ``why`` value (mappings, sequences, placements, numbers)."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x) for x in v]
    if isinstance(v, float):
        return round(v, 6)
    if isinstance(v, (str, int, bool)) or v is None:
        return v
    return str(v)


def mentions(rec: Mapping[str, Any], *, job: str | None = None, gpu: str | None = None) -> bool:
    """True when the record concerns ``job`` (decided on, restarted, in the mix) / ``gpu``."""
    if gpu is not None and rec.get("gpu") != gpu:
        return False
    if job is None:
        return True
    if rec.get("job") == job or job in (rec.get("jobs") or []) or \
            job in (rec.get("restarts") or []):
        return True
    return (rec.get("cause") or {}).get("job") == job
