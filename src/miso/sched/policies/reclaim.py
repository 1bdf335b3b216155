"""Fair share's reclaim, for every owner-aware policy (on with
``TenancyConfig(fair_share=True)``, off with ``reclaim=False``): room lent to owners above
their entitlement is returned to a waiting owner below its own (Kueue's
``reclaimWithinCohort``; entitlements and fair slices: :mod:`miso.sched.tenancy`).

Run before the policy places the queue: when a protected owner waits (a queued job, the first
of its jobs in the tenancy order, that the policy has no room for) and one more fair slice
keeps it within its entitlement, jobs of owners above their entitlement on ONE GPU are
checkpointed and requeued until a layout gives the waiting job its fair slice beside the jobs
that stay (and every protected job there keeps its own); that GPU is then reserved for the
waiting owner for the rest of the call. Victims: running at least ``min_run_s`` since their
last start, able to checkpoint unless ``preempt_uncheckpointable``, of no higher priority than
the waiting job, their owners staying at or above their entitlement; cheapest first by the
restart economy's price (:func:`~miso.sched.policies.preempt.victim_cost`). The GPU: the
fewest victims, then the least GPU time thrown away, then GPU order. When only the minimum run
time stands in the way, a timer (``WakeUp`` tagged ``reclaim``) brings the decision back when
it has passed.

**Only when it buys something** (issue 31): a reclaim restores the waiting job's fair slice;
it is made only when that slice is larger than what packing already gives the job (its
*packed share*: ``1 / n`` of a GPU at ``n`` active jobs per GPU, the backlog of
:class:`~miso.sched.fairprice.Backlog` now or averaged, the larger, rounded down to a slice
that holds it), so a fair slice of one compute slice, which packing gives anyway, reclaims
nothing. And at most one reclaim per GPU per ``min_run_s`` (``Tenancy.reclaimed_at``). Each
reclaim's ``why`` names the job it is for (``for_job``), its fair slice and its packed share
as parts of a GPU (``fair_slice``, ``packed_share``): the simulator counts the reclaims whose
job then got no larger slice (``reclaims_useless``, expected 0). The job keeps the fair slice
its room was returned for until it starts (``FairSlices.promised``): its owner's entitlement
per job may shrink while the victims checkpoint (one more of its jobs arrives), and without
the promise it could then be placed on no more than its packed share (measured: 1 such
reclaim at 1.6x, seed 1, the heavy owner's job owed 4g by its entitlement per job, given 3g).

**Growth in place** (with a stated price): a protected owner's job that has run long
(``Entitled.kept``) and is owed a whole GPU by its owner's weighted part of the cluster
(``Entitled.grown``), but shares its GPU, gets it whole when every other resident there may
be reclaimed (their owners not protected and left with at least their entitlement and
weighted part): they are requeued and the GPU is re-planned in the same call. Measured,
Philly by vc at 5 %: vc e13805's two ~0.85 M s jobs ran on 4g slices beside the largest
vc's long jobs from start to end (sharing incentive 1.51); grown, 1.34. A job that has run
long is not a victim either while its owner holds at most its weighted part plus one GPU
(one growth's worth: without it a grown owner's other job was taken by the next reclaim).

When no reclaim is made for such a waiting job, it holds one GPU from the other owners' new
jobs instead (:mod:`miso.sched.policies.fairhold`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from miso.sched.decisions import RequeueCause, WakeUp
from miso.sched.policies.fairhold import first_room, fitting_fractions, hold_owed
from miso.sched.policies.preempt import victim_cost

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.base import BasePolicy, Scratch

#: At most this many GPUs reclaimed per decision call.
MAX_PER_CALL = 4
#: At most one reclaim per GPU per this many ``min_run_s``.
GPU_GAP_RUNS = 1.0
#: The tag of the reclaim timer.
TAG = "reclaim"


def reclaim(policy: BasePolicy, now: float, sc: Scratch) -> bool:
    """Reclaim room for waiting protected owners; True when jobs were requeued (the caller
    then has the policy place the queue)."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    promised = _promises(sc)
    if not st.queue:
        return False
    ents = sc.entitlements()
    held = dict(ten.held)
    done = 0
    wake: float | None = None
    tried: set[str] = set()
    for j in sc.queue():
        o = st.jobs[j].spec.owner
        if o in tried:
            continue
        tried.add(o)
        if not ten.protected(o, ents) or policy.has_room(sc, j):
            continue
        worth = _worth(sc, j)
        if worth is None:
            _hold_if_under(policy, sc, j, ents, held)
            continue
        got, later = _best_gpu(policy, now, sc, j, ents, held)
        if got is None:
            if later is not None:
                wake = later if wake is None else min(wake, later)
            _hold_if_under(policy, sc, j, ents, held)
            continue
        g, victims, cost, gain = got
        if held.get(o, 0.0) + gain > ents.get(o, 0.0) + 1e-6:
            continue
        _return_room(sc, j, g, victims, cost, ents, held, worth)
        ten.reclaimed_at[g] = now
        promised[j] = worth[0]
        held[o] = held.get(o, 0.0) + gain
        done += 1
        if done >= MAX_PER_CALL:
            break
    done += _grow(policy, now, sc, ents, held, MAX_PER_CALL - done)
    if wake is not None and not done:
        _wake_at(policy, sc, now, wake)
    return done > 0


def _grow(policy: BasePolicy, now: float, sc: Scratch, ents: dict[str, float],
          held: dict[str, float], room: int) -> int:
    """Reclaims for running jobs: a protected owner's job that has run long
    (:meth:`~miso.sched.policies.entitled.Entitled.kept`) and is owed a whole GPU
    (:meth:`~miso.sched.policies.entitled.Entitled.grown`) but shares its GPU, when every
    other resident there may be reclaimed: they are requeued and the GPU is reserved for
    the owner, so the job grows in place. Returns the GPUs so reclaimed (at most one a
    call)."""
    if room <= 0:
        return 0
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    gap = GPU_GAP_RUNS * ten.config.min_run_s
    for g, gs in st.gpus.items():
        resident = sc.jobs_on(g)
        if (gs.busy or len(resident) < 2 or g in sc.touched or g in sc.reserved
                or ten.reclaimed_at.get(g, -gap) + gap > now + 1e-9):
            continue
        for j in resident:
            got = _grow_victims(policy, now, sc, j, g, resident, ents, held)
            if got is None:
                continue
            victims, cur = got
            _return_room(sc, j, g, tuple(victims), sum(
                victim_cost(sc, v, now, policy.restart_price(v)) for v in victims),
                ents, held, (1.0, cur))
            ten.reclaimed_at[g] = now
            policy.replan_later(g)   # re-planned in this call: the job grows
            o = st.jobs[j].spec.owner
            held[o] = held.get(o, 0.0) + 1.0 - cur
            return 1
    return 0


def _grow_victims(policy: BasePolicy, now: float, sc: Scratch, job: str, g: str,
                  resident: list[str], ents: dict[str, float], held: dict[str, float]
                  ) -> tuple[list[str], float] | None:
    """(the other residents of ``g``, the part of a GPU ``job`` runs on) when ``job`` is
    owed a whole GPU it does not have, its owner stays within its entitlement with it, and
    every other resident may be reclaimed for it; else None."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    js = st.jobs[job]
    o = js.spec.owner
    if js.status.value != "running" or not ten.protected(o, ents):
        return None
    fair = sc.fair
    cur = fair.kept(job)
    if cur <= 0 or fair.grown(o) < 1.0:
        return None
    if cur >= 1.0 - 1e-9 or held.get(o, 0.0) + 1.0 - cur > fair.part(o) + 1e-6:
        return None
    others = [v for v in resident if v != job]
    priced, _ = _priced(policy, sc, now, job, others, ents, held)
    if len(priced) < len(others):
        return None
    lost: dict[str, float] = {}
    for _, v in priced:
        vo = st.jobs[v].spec.owner
        lost[vo] = lost.get(vo, 0.0) + ten.charge_of(v)
        if (ten.protected(vo, ents) or held.get(vo, 0.0) - lost[vo]
                < max(ents.get(vo, 0.0), fair.part(vo)) - 1e-6):
            return None
    return [v for _, v in priced], cur


def _promises(sc: Scratch) -> dict[str, float]:
    """The reclaims' promised fair slices (``FairSlices.promised``), less those of jobs now
    running on a slice or gone (a promise is kept until then)."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    promised = ten.slices.promised
    for j in [j for j in promised if j not in st.jobs
              or st.jobs[j].status.value not in ("queued", "placed")]:
        del promised[j]
    return promised


def _hold_if_under(policy: BasePolicy, sc: Scratch, job: str, ents: dict[str, float],
                   held: dict[str, float]) -> None:
    """Hold a GPU for ``job``, and for its owner's next waiting jobs within what the owner is
    still owed (:func:`~miso.sched.policies.fairhold.hold_owed`), when its owner holds less
    than its entitlement (not merely within its margin)."""
    o = sc.state.jobs[job].spec.owner
    owed = ents.get(o, 0.0) - held.get(o, 0.0)
    if owed > 1e-6:
        hold_owed(policy, sc, job, owed)


def _wake_at(policy: BasePolicy, sc: Scratch, now: float, wake: float) -> None:
    """A ``WakeUp`` at ``wake`` unless the one asked before (the policy's ``reclaim_timer``,
    its own memory: the ledger is the driver's) is pending and not later. Never at or before
    ``now``: that decision would come back at the same instant, find the same state and ask
    again, forever (seen: a per-GPU gap whose end rounded to just before the timer)."""
    if wake <= now + 1e-9:
        return
    timer = policy.reclaim_timer
    if timer is None or timer <= now or wake < timer - 1e-9:
        policy.reclaim_timer = wake
        sc.out.append(WakeUp(wake, TAG))


def _worth(sc: Scratch, job: str) -> tuple[float, float] | None:
    """(the fair slice ``job`` is owed, its packed share), parts of a GPU, when the fair
    slice is the larger (a reclaim for it buys something); else None."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    if not st.gpus:
        return None
    geom = next(iter(st.gpus.values())).geom
    first = first_room(sc, geom, job)
    if first is not None:   # its owner holds nothing: packing gives it nothing now
        return first
    owed = sc.fair.fair_slices(geom, st.jobs[job].spec.owner, job)
    if owed is None:        # the smallest slice: what packing gives anyway
        return None
    full = geom.model.full_profile().compute_slices
    fair = min(p.compute_slices for p in geom.profiles if p.name in owed) / full
    fit = fitting_fractions(geom, st.jobs[job].spec.memory_gb)
    if not fit:
        return None
    n = max(ten.backlog.value, ten.backlog.last, 1.0)   # active jobs per GPU, now or lately
    packed = max(c for c in fit if c <= max(1.0 / n, min(fit)) + 1e-9)
    return (fair, packed) if fair > packed + 1e-9 else None


def _return_room(sc: Scratch, job: str, g: str, victims: tuple[str, ...], cost: float,
                 ents: dict[str, float], held: dict[str, float],
                 worth: tuple[float, float]) -> None:
    """Requeue ``victims`` from ``g`` for ``job``'s owner (``held`` follows) and reserve ``g``
    for that owner for the rest of the call."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    o = st.jobs[job].spec.owner
    n = len(victims)
    note = (f"fair share: owner {o or '(none)'} holds {held.get(o, 0.0):.1f} of the "
            f"{ents.get(o, 0.0):.1f} GPUs it is entitled to and waits; room on {g} is "
            f"returned to it: {n} job{'s' if n != 1 else ''} of owners above their "
            f"entitlement checkpointed and requeued, {cost:.0f} GPU-s of restarts")
    for v in victims:
        vo = st.jobs[v].spec.owner
        sc.requeue(v, f"fair share: room on {g} returned to owner {o or '(none)'}, below "
                      f"its entitlement (owner {vo or '(none)'} holds "
                      f"{held.get(vo, 0.0):.1f} of its {ents.get(vo, 0.0):.1f})",
                   why={"trigger": "reclaim", "gpu": g, "for_owner": o, "for_job": job,
                        "fair_slice": worth[0], "packed_share": worth[1],
                        "victims": n, "lost_gpu_s": cost, "note": note},
                   cause=RequeueCause.RECLAIMED)
        held[vo] = held.get(vo, 0.0) - ten.charge_of(v)
    sc.reserved[g] = o


def _priced(policy: BasePolicy, sc: Scratch, now: float, job: str, resident: list[str],
            ents: dict[str, float], held: dict[str, float]
            ) -> tuple[list[tuple[float, str]], float]:
    """(the residents that may be reclaimed for ``job``, cheapest first, with their price;
    when the ones not run ``min_run_s`` yet become reclaimable): of another owner above its
    entitlement, of no higher priority, able to checkpoint (unless
    ``preempt_uncheckpointable``), not placed in this call."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    cfg = ten.config
    owner = st.jobs[job].spec.owner
    prio = st.jobs[job].spec.priority
    priced: list[tuple[float, str]] = []
    ready = now
    for v in resident:
        vs = st.jobs[v]
        vo = vs.spec.owner
        since = ten.running_since.get(v)
        if (vo == owner or v in sc.placed or since is None or vs.spec.priority > prio
                or held.get(vo, 0.0) <= ents.get(vo, 0.0) + 1e-6
                or (not vs.spec.checkpointable and not cfg.preempt_uncheckpointable)):
            continue
        if (cfg.fairness_price is not None and sc.fair.kept(v) > 0
                and held.get(vo, 0.0) <= sc.fair.part(vo) + 1.0):
            continue        # run long, its owner within its part: kept (Entitled.kept)
        if now - since < cfg.min_run_s:
            ready = max(ready, since + cfg.min_run_s)
            continue
        priced.append((victim_cost(sc, v, now, policy.restart_price(v)), v))
    priced.sort()
    return priced, ready


def _best_gpu(policy: BasePolicy, now: float, sc: Scratch, job: str,
              ents: dict[str, float], held: dict[str, float],
              ) -> tuple[tuple[str, tuple[str, ...], float, float] | None, float | None]:
    """((GPU, victims, cost, the waiting owner's gain in GPUs) or None, the earliest time a
    GPU blocked only by the minimum run time becomes reclaimable)."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    owner = st.jobs[job].spec.owner
    best: tuple[int, float, str, tuple[str, ...], float] | None = None
    later: float | None = None
    last = ten.reclaimed_at
    gap = GPU_GAP_RUNS * ten.config.min_run_s
    for g, gs in st.gpus.items():
        if gs.busy or g in sc.touched or sc.reserved.get(g, owner) != owner:
            continue
        # one reclaim per GPU per min_run_s (a tolerance: a timer set for the moment the gap
        # ends must find it ended, or it would be set again for that same moment, forever)
        if g in last and last[g] + gap > now + 1e-9:
            later = _sooner(later, last[g] + gap)
            continue
        resident = sc.jobs_on(g)
        priced, ready = _priced(policy, sc, now, job, resident, ents, held)
        got = _take_until_fits(policy, sc, job, g, resident, priced, ents, held,
                               None if best is None else best[0])
        if got is None:
            if ready > now + 1e-9:   # jobs not run long enough yet may make room then
                later = _sooner(later, ready)
            continue
        victims, lost = got
        cost = sum(victim_cost(sc, v, now, policy.restart_price(v)) for v in victims)
        gain = sum(lost.values())
        key = (len(victims), cost, g, tuple(victims), gain)
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        return None, later
    return (best[2], best[3], best[1], best[4]), None


def _sooner(t: float | None, u: float) -> float:
    """The earlier of ``t`` (None: not yet known) and ``u``."""
    return u if t is None else min(t, u)


def _take_until_fits(policy: BasePolicy, sc: Scratch, job: str, g: str, resident: list[str],
                     priced: list[tuple[float, str]], ents: dict[str, float],
                     held: dict[str, float], cap: int | None
                     ) -> tuple[list[str], dict[str, float]] | None:
    """(victims, GPUs each of their owners loses): the ``priced`` residents of ``g``, cheapest
    first, taken (each owner staying at or above its entitlement) until ``job`` passes the
    policy's fit test on the rest; None when it never does or needs ``cap`` victims or more."""
    ten = sc.state.tenancy
    assert ten is not None
    victims: list[str] = []
    rest = list(resident)
    lost: dict[str, float] = {}
    for _, v in priced:
        if cap is not None and len(victims) >= cap:
            return None
        vo = sc.state.jobs[v].spec.owner
        c = ten.charge_of(v)
        if held.get(vo, 0.0) - lost.get(vo, 0.0) - c < ents.get(vo, 0.0) - 1e-6:
            continue
        victims.append(v)
        lost[vo] = lost.get(vo, 0.0) + c
        rest.remove(v)
        if policy.fits(sc.cycle, job, g, rest):  # the entitlement filter included
            return victims, lost
    return None
