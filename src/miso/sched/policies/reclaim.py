"""Fair share's reclaim, for every policy (on with ``TenancyConfig(fair_share=True)``, off with
``reclaim=False``): a GPU lent to an owner above its entitlement is returned to a waiting owner
below its own (Kueue's ``reclaimWithinCohort``; entitlements: :mod:`miso.sched.tenancy`).

Run before the policy places the queue: when an owner waits (a queued job, the first of its
jobs in the tenancy order), holds at least one GPU less than its entitlement and no GPU is
idle, the jobs of other owners on ONE GPU are checkpointed and requeued, so that GPU is the
least crowded one when the policy places the queue (the waiting owner's job goes first in the
fair-share order). The GPU chosen: every other owner's job there may be preempted (running at
least ``min_run_s`` since its last start, able to checkpoint unless
``preempt_uncheckpointable``, of no higher priority than the waiting job), every owner losing
jobs stays at or above its entitlement, the policy could place the waiting job there
(:meth:`~miso.sched.policies.base.BasePolicy.room_after`); then the fewest victims, then the
least GPU time thrown away (:func:`~miso.sched.policies.preempt.victim_cost`, the restart
economy's price), then GPU order. When only the minimum run time stands in the way, a timer
(``WakeUp`` tagged ``reclaim``) brings the decision back when it has passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from miso.sched.decisions import WakeUp
from miso.sched.policies.preempt import DEFAULT_RESTART_S, victim_cost

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.base import BasePolicy, Scratch

#: At most this many GPUs reclaimed per decision call.
MAX_PER_CALL = 4
#: The tag of the reclaim timer.
TAG = "reclaim"


def reclaim(policy: BasePolicy, now: float, sc: Scratch) -> bool:
    """Reclaim GPUs for waiting owners below their entitlement; True when jobs were requeued
    (the caller then has the policy place the queue)."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    if not st.queue:
        return False
    for g in st.gpus:
        if not sc.jobs_on(g):
            return False      # an idle GPU: the policy places there, nothing to reclaim
    ents = sc.entitlements()
    held = dict(ten.held)
    restart_s = float(getattr(policy, "restart_s", DEFAULT_RESTART_S))
    done = 0
    wake: float | None = None
    tried: set[str] = set()
    for j in sc.queue():
        o = st.jobs[j].spec.owner
        if o in tried:
            continue
        tried.add(o)
        if held.get(o, 0.0) + 1.0 > ents.get(o, 0.0) + 1e-6:
            continue
        got, later = _best_gpu(policy, now, sc, j, ents, held, restart_s)
        if got is None:
            if later is not None:
                wake = later if wake is None else min(wake, later)
            continue
        g, victims, cost = got
        split = ten.split_of(g)
        n = len(victims)
        note = (f"fair share: owner {o or '(none)'} holds {held.get(o, 0.0):.1f} of the "
                f"{ents.get(o, 0.0):.1f} GPUs it is entitled to and waits; {g} is returned to "
                f"it: {n} job{'s' if n != 1 else ''} of owners above their entitlement "
                f"checkpointed and requeued, {cost:.0f} GPU-s of restarts")
        for v in victims:
            vo = st.jobs[v].spec.owner
            sc.requeue(v, f"fair share: {g} returned to owner {o or '(none)'}, below its "
                          f"entitlement (owner {vo or '(none)'} holds "
                          f"{held.get(vo, 0.0):.1f} of its {ents.get(vo, 0.0):.1f})",
                       why={"trigger": "reclaim", "gpu": g, "for_owner": o,
                            "victims": n, "lost_gpu_s": cost, "note": note})
        sc.reserved[g] = o
        for vo, part in split.items():
            if vo != o:
                held[vo] = held.get(vo, 0.0) - part
        held[o] = held.get(o, 0.0) + 1.0 - split.get(o, 0.0)
        done += 1
        if done >= MAX_PER_CALL:
            break
    if wake is not None and not done and (ten.reclaim_timer is None
                                          or ten.reclaim_timer <= now
                                          or wake < ten.reclaim_timer - 1e-9):
        ten.reclaim_timer = wake
        sc.out.append(WakeUp(wake, TAG))
    return done > 0


def _best_gpu(policy: BasePolicy, now: float, sc: Scratch, job: str,
              ents: dict[str, float], held: dict[str, float], restart_s: float,
              ) -> tuple[tuple[str, tuple[str, ...], float] | None, float | None]:
    """((GPU, victims, cost) or None, the earliest time a GPU blocked only by the minimum run
    time becomes reclaimable)."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    cfg = ten.config
    owner = st.jobs[job].spec.owner
    prio = st.jobs[job].spec.priority
    best: tuple[int, float, str, tuple[str, ...]] | None = None
    later: float | None = None
    for g, gs in st.gpus.items():
        if gs.busy or g in sc.touched:
            continue
        resident = sc.jobs_on(g)
        victims = tuple(v for v in resident if st.jobs[v].spec.owner != owner)
        if not victims or (best is not None and len(victims) > best[0]):
            continue
        ok = True
        ready = now
        lose: dict[str, float] = {}
        for v in victims:
            vs = st.jobs[v]
            since = ten.running_since.get(v)
            if (v in sc.placed or since is None or vs.spec.priority > prio
                    or (not vs.spec.checkpointable and not cfg.preempt_uncheckpointable)):
                ok = False
                break
            ready = max(ready, since + cfg.min_run_s)
            vo = vs.spec.owner
            lose[vo] = ten.split_of(g).get(vo, 0.0)
        if not ok:
            continue
        if any(held.get(vo, 0.0) - part < ents.get(vo, 0.0) - 1e-6
               for vo, part in lose.items()):
            continue
        rest = [v for v in resident if v not in victims]
        if not policy.room_after(g, rest, job, sc):
            continue
        if ready > now + 1e-9:
            later = ready if later is None else min(later, ready)
            continue
        cost = sum(victim_cost(sc, v, now, restart_s) for v in victims)
        key = (len(victims), cost, g, victims)
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        return None, later
    return (best[2], best[3], best[1]), None
