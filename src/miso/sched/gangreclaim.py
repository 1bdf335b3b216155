"""Fair share's reclaim for gangs (issue 31): a gang of an owner below its entitlement does
not wait for other owners' long whole-GPU runs to end.

The gang layer (:mod:`miso.sched.gangs`) drains a reservation's GPUs: their residents run to
their end. On a trace whose gangs run for days (Philly), a small owner's gang, first in fair
share's order, then waits days behind the gangs of owners far above their share. With fair
share's reclaim on (``TenancyConfig.entitled``), when the first gang in fair share's order
cannot start within ``min_run_s`` and its owner, given the gang, stays within its entitlement
(rounded up to the gang's size: a share smaller than the gang could never run it), whole-GPU
runs of owners above their entitlement are checkpointed and requeued
(:class:`~miso.sched.decisions.StopGang`) until the gang starts on their GPUs and the idle held
ones. Victims: other owners' gangs (not backfills, which the reservation stops anyway),
running at least ``min_run_s``, able to checkpoint unless ``preempt_uncheckpointable``, of no
higher priority, whose owner holds more than its entitlement rounded up to the run's size
(the rule that says who is owed, seen from the other side: the stopped run, requeued, is not
owed its room back, so the room never swings back); the most over-entitled owner's first,
then the smallest runs.

When those runs are not enough, whole GPUs of the policies' view are emptied for the gang
(:func:`view_room`: Slurm's fair-share priority with a reservation would start the gang there
too; draining them waits for one-GPU jobs that run for days): idle ones first, then GPUs whose
every resident is another owner's one-GPU job running at least ``min_run_s``, able to
checkpoint (unless ``preempt_uncheckpointable``), of no higher priority, whose owner stays at
or above its entitlement after the GPU is taken (fewest residents first; the residents are
checkpointed and requeued, ``RequeueJob`` with cause ``reclaimed`` and ``why["for_gang"]``).
The reservation itself, with fair share's reclaim and the gang owed, ranks a GPU whose
residents may all be requeued by when they may be (:func:`takeable`) rather than by their
end, then by the work its residents have left (least first); held, it drains its short jobs,
and once only it (and idle or backfilled GPUs) stands between the gang and its reservation,
its long residents are requeued and the gang starts (:func:`_reserved_room`).

The gang layer gives those GPUs back to the policy when the gang's run ends
(``GangLayer.lent``): the room was owed to that gang, not to the gangs queued behind it
(measured, Philly by vc at 5 %, seed 1: kept for the next gangs, the largest vc's one-GPU
jobs waited 14,900 s on average instead of 11,800 s).

Entitlements here are in whole GPUs: every GPU (the policies' view and the held ones) water-
filled by weight (:func:`~miso.sched.fairfill.two_level_fill`) over owners' demands, each the
GPUs it holds plus those its queued jobs ask for (a one-GPU job one, a gang its ``num_gpus``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from miso.sched.decisions import RequeueCause, RequeueJob, StopGang
from miso.sched.fairfill import two_level_fill

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.gangs import GangPass
    from miso.sched.state import ClusterState
    from miso.sched.tenancyconfig import TenancyConfig

#: picks ``n`` GPUs of a pool (``nodes``: exactly that many nodes), or None (gangs.pick_gpus)
Picker = Callable[[list[str], int, "int | None"], "list[str] | None"]


def gang_entitlements(st: ClusterState) -> dict[str, float]:
    """Owner -> whole GPUs it is entitled to now (module docstring)."""
    ten = st.tenancy
    assert ten is not None
    demand: dict[str, float] = {o: h for o, h in ten.held.items() if h > 1e-9}
    for j in st.queue:
        o = st.jobs[j].spec.owner
        demand[o] = demand.get(o, 0.0) + 1.0
    for j in st.gangs.queue:
        spec = st.jobs[j].spec
        demand[spec.owner] = demand.get(spec.owner, 0.0) + spec.num_gpus
    return two_level_fill(float(len(st.gpus) + len(st.gangs.gpus)), demand, ten.config)


def owed(st: ClusterState, head: str, ents: dict[str, float]) -> bool:
    """``head``'s owner, given the gang, stays within its entitlement rounded up to the gang."""
    ten = st.tenancy
    assert ten is not None
    spec = st.jobs[head].spec
    have = ten.held.get(spec.owner, 0.0)
    return have + spec.num_gpus <= max(ents.get(spec.owner, 0.0), spec.num_gpus) + 1e-6


def _may_stop(st: ClusterState, j: str, head: str, started: Mapping[str, float],
              now: float) -> bool:
    """Run ``j`` is another owner's, running for ``min_run_s``, of no higher priority than
    ``head``, able to checkpoint (unless ``preempt_uncheckpointable``), no plan in flight."""
    ten = st.tenancy
    assert ten is not None
    cfg, book = ten.config, st.gangs
    js, me = st.jobs[j], st.jobs[head].spec
    since = started.get(j)
    return not (js.spec.owner == me.owner or js.status.value != "running" or since is None
                or now - since < cfg.min_run_s or js.spec.priority > me.priority
                or not (js.spec.checkpointable or cfg.preempt_uncheckpointable)
                or any(book.gpus[g].pending is not None for g in book.runs[j]
                       if g in book.gpus))


def _over_by_a_run(held: Mapping[str, float], ents: Mapping[str, float], owner: str,
                    n: int) -> bool:
    """``owner`` holds more than its entitlement rounded up to a run of ``n`` GPUs, so that
    run, stopped and requeued, is not owed its room back (:func:`owed`'s rule)."""
    return held.get(owner, 0.0) > max(ents.get(owner, 0.0), float(n)) + 1e-6


def victims(st: ClusterState, head: str, ents: dict[str, float], skip: set[str],
            started: Mapping[str, float], now: float) -> list[str]:
    """Whole-GPU runs that may be stopped for ``head``, in the order to take them
    (``started``: when each run started; ``skip``: runs never taken)."""
    ten = st.tenancy
    assert ten is not None
    book = st.gangs
    out = [j for j, gpus in book.runs.items()
           if j not in skip and _may_stop(st, j, head, started, now)
           and _over_by_a_run(ten.held, ents, st.jobs[j].spec.owner, len(gpus))]
    over = {o: ten.held.get(o, 0.0) - ents.get(o, 0.0) for o in ten.held}
    return sorted(out, key=lambda j: (-over[st.jobs[j].spec.owner], len(book.runs[j]),
                                      st.jobs[j].submitted_at, j))


def reclaim_for(ps: GangPass, head: str, backfills: set[str], started: Mapping[str, float],
                pick: Picker, res: list[str] | None = None) -> set[str] | None:
    """Start ``head`` now on its reservation ``res`` emptied of its draining GPUs' residents
    (:func:`_reserved_room`), or else on other owners' stopped whole-GPU runs and, when
    those are not enough, on whole GPUs of the policies' view emptied of over-entitled
    owners' jobs (module docstring); when it did (``ps.out`` then holds the stops, requeues
    and the start) the GPUs it emptied (to give back when the run ends), else None."""
    drained = _reserved_room(ps, head, res or [], backfills, pick)
    return drained if drained is not None else _reclaim_runs(ps, head, backfills, started,
                                                             pick)


def _reclaim_runs(ps: GangPass, head: str, backfills: set[str], started: Mapping[str, float],
                  pick: Picker) -> set[str] | None:
    """:func:`reclaim_for` on stopped runs and emptied GPUs of the policies' view."""
    st = ps.st
    ten = st.tenancy
    if ten is None or not ten.config.entitled:
        return None
    ents = gang_entitlements(st)
    if not owed(st, head, ents):
        return None
    book, spec = st.gangs, st.jobs[head].spec
    got, taken, freed = _room(ps, head, ents, backfills, started, pick)
    if got is None:
        return None
    need = [v for v in taken if set(book.runs[v]) & set(got)]
    if not (need or any(g in freed for g in got)):
        return None
    for v in need:
        ps.out.append(StopGang(v, f"reclaimed for {head} of owner {spec.owner or '(none)'}, "
                                  "below its entitlement"))
    for g in got:
        _requeue_for(ps, head, g, freed.get(g, ()))
    ps.start(head, got, False)
    return {g for g in got if g in st.gpus}


def _room(ps: GangPass, head: str, ents: Mapping[str, float], backfills: set[str],
          started: Mapping[str, float], pick: Picker
          ) -> tuple[list[str] | None, list[str], dict[str, tuple[str, ...]]]:
    """(``head``'s GPUs or None, the whole-GPU runs to stop, the policies' GPUs to empty with
    their residents): idle held GPUs, then other owners' runs, then the policies' GPUs."""
    st = ps.st
    ten = st.tenancy
    assert ten is not None
    book, spec = st.gangs, st.jobs[head].spec
    pool = [g for g in book.gpus if g not in ps.used and book.idle(g)]
    held = dict(ten.held)
    taken = _take(ps, head, ents, victims(st, head, ents, backfills, started, ps.now), pool,
                  pick, held)
    got = pick(pool, spec.num_gpus, spec.nodes)
    freed: dict[str, tuple[str, ...]] = {}
    if got is None:
        freed = view_room(ps, head, ents, held, pool, pick)
        got = pick(pool, spec.num_gpus, spec.nodes)
    return got, taken, freed


def _reserved_room(ps: GangPass, head: str, res: list[str], backfills: set[str],
                   pick: Picker) -> set[str] | None:
    """When only draining GPUs stand between ``head`` and its reservation ``res`` (the rest
    idle or backfilled) and :func:`view_room`'s rules allow emptying all of them
    (:func:`_drainable`): stop the backfills, requeue the residents (the GPU back to the
    view for that, then held again) and start ``head``; the GPUs so emptied (lent), else
    None. The reservation ranks such a GPU by when it may be emptied (:func:`takeable`);
    held, it takes no new job, its short jobs end, and its long ones are requeued here."""
    book, spec = ps.st.gangs, ps.st.jobs[head].spec
    drain = _drainable(ps, head, res, backfills)
    got = pick(res, spec.num_gpus, spec.nodes) if drain else None
    if got is None:
        return None
    for j in sorted({j for g in res if (j := book.run_on(g)) is not None}):
        ps.out.append(StopGang(j, f"the reservation of {head} starts"))
        backfills.discard(j)
    for g in drain:
        ps.release(g)
        _requeue_for(ps, head, g, tuple(book.gpus[g].jobs))
        ps.hold(g, head)
    ps.start(head, got, False)
    return set(drain)


def _priced_reclaim(cfg: TenancyConfig) -> bool:
    """Fair share's reclaim with a stated price: the reservation's draining (:func:`takeable`,
    :func:`_drainable`) applies."""
    return cfg.entitled and cfg.fairness_price is not None


def _drainable(ps: GangPass, head: str, res: list[str], backfills: set[str]) -> list[str]:
    """The draining GPUs of the reservation ``res`` when, with fair share's reclaim, a
    stated price (:func:`takeable`) and ``head`` owed, they are all that stands in its way
    (the rest of ``res`` held, idle or backfilled) and each may be emptied for it
    (:func:`_may_empty`) with every resident's owner left at or above its entitlement;
    else none."""
    st = ps.st
    ten = st.tenancy
    if ten is None or not _priced_reclaim(ten.config):
        return []
    book = st.gangs
    if any(g not in book.gpus or g in ps.used for g in res):
        return []
    drain = [g for g in res if book.run_on(g) is None and book.gpus[g].jobs]
    if any(book.run_on(g) not in backfills for g in res
           if g not in drain and book.run_on(g) is not None):
        return []
    return drain if drain and _may_empty_all(ps, head, drain) else []


def _may_empty_all(ps: GangPass, head: str, drain: list[str]) -> bool:
    """``head`` is owed its gang and every GPU of ``drain`` may be emptied for it
    (:func:`_may_empty`), every resident's owner left at or above its entitlement."""
    st = ps.st
    ten = st.tenancy
    assert ten is not None
    ents = gang_entitlements(st)
    if not owed(st, head, ents):
        return False
    held = dict(ten.held)
    for g in drain:
        if not _may_empty(ps, g, head, []):
            return False
        for o, x in ten.split_of(g).items():
            held[o] = held.get(o, 0.0) - x
        if any(held[o] < ents.get(o, 0.0) - 1e-6 for o in ten.split_of(g)):
            return False
    return True


def takeable(ps: GangPass, head: str) -> Callable[[str, float], tuple[float, float]]:
    """How the reservation of ``head`` ranks a GPU expected free at ``end``: with fair share's
    reclaim and a stated price (with growth, ``reclaim._grow``: without a price decisions
    are kept), while ``head``'s owner is owed the gang, a GPU (of the policies' view, or
    held and draining) whose every resident could be requeued for it (:func:`view_room`'s
    rules) counts as free once each has run ``min_run_s`` and ``min_run_s`` from now (the
    time a held GPU takes to drain its short jobs), when sooner than ``end``, then by the
    most work one of its residents has left (:func:`_left`: the requeued jobs keep their
    place in their owner's FIFO, ahead of its queued short jobs, so the least work put back
    first); else at ``end``. Measured (Philly by vc at 5 %,
    long jobs grown to whole GPUs): in the largest vc's flood every GPU ran some long job,
    so vc 2869ce's 8-GPU gang reserved another gang's run ending days later and waited for a
    GPU of the view to be emptiable (every resident past ``min_run_s``, which the flood's
    new short jobs never left true): 1.68 / 1.46 / 1.66 (seeds 1-3); so ranked, 1.08. Then
    by the fewest residents, the flood's long jobs (alone on whole GPUs, grown) were the
    ones requeued and its short jobs' mean slowdown was 287 (seeds 1-3); by work left,
    131, at a price of +1.0-1.5 % instead of +2.4-3.0 % (max sharing incentive 1.42)."""
    st = ps.st
    ten = st.tenancy
    if ten is None or not _priced_reclaim(ten.config):
        return lambda g, end: (end, 0.0)
    ents = gang_entitlements(st)
    if not owed(st, head, ents):
        return lambda g, end: (end, 0.0)
    book, min_run = st.gangs, ten.config.min_run_s

    def at(g: str, end: float) -> tuple[float, float]:
        gs = st.gpus.get(g) or (book.gpus.get(g) if book.run_on(g) is None else None)
        if gs is None or not gs.jobs or gs.pending is not None or st.services.by_gpu.get(g) \
                or not all(_may_requeue(ps, j, head, 0.0) for j in gs.jobs) \
                or any(ten.held.get(o, 0.0) - x < ents.get(o, 0.0) - 1e-6
                       for o, x in ten.split_of(g).items()):
            return end, 0.0
        t = max(ps.now + min_run, *(ten.running_since.get(j, ps.now) + min_run for j in gs.jobs))
        return (t, _left(st, gs.jobs, ps.now)) if t < end else (end, 0.0)

    return at


def _left(st: ClusterState, jobs: list[str], now: float) -> float:
    """The most work one of ``jobs`` has left (s alone on a full GPU, from its last progress
    report; inf when one's is unknown): what its requeue puts back in its owner's queue."""
    left = [st.jobs[j].remaining_work(now) for j in jobs]
    return max((math.inf if x is None else x for x in left), default=0.0)


def _requeue_for(ps: GangPass, head: str, g: str, jobs: tuple[str, ...]) -> None:
    """Checkpoint and requeue ``jobs`` (the residents of the policies' GPU ``g``) so that
    ``head`` starts on ``g``."""
    st = ps.st
    owner = st.jobs[head].spec.owner or "(none)"
    for j in jobs:
        vo = st.jobs[j].spec.owner or "(none)"
        ps.out.append(RequeueJob(
            j, f"fair share: {g} returned whole to gang {head} of owner {owner}, below its "
               f"entitlement (owner {vo} above its own)",
            cause=RequeueCause.RECLAIMED,
            why={"trigger": "reclaim", "gpu": g, "for_owner": owner, "for_gang": head,
                 "victims": len(jobs)}))


def _may_requeue(ps: GangPass, j: str, head: str, run_s: float | None = None) -> bool:
    """One-GPU job ``j`` may be requeued for gang ``head``: another owner's, running for
    ``run_s`` (default ``min_run_s``) since its last start, of no higher priority, able to
    checkpoint (unless ``preempt_uncheckpointable``), not placed in this call."""
    st = ps.st
    ten = st.tenancy
    assert ten is not None
    cfg = ten.config
    js, me = st.jobs[j], st.jobs[head].spec
    since = ten.running_since.get(j)
    need = cfg.min_run_s if run_s is None else run_s
    return not (js.spec.owner == me.owner or js.status.value != "running" or since is None
                or ps.now - since < need or js.spec.priority > me.priority
                or not (js.spec.checkpointable or cfg.preempt_uncheckpointable)
                or j in ps.placed)


def _may_empty(ps: GangPass, g: str, head: str, pool: list[str]) -> bool:
    """The policies' GPU ``g`` may be emptied for ``head``: not decided on, started on or held
    in this call, not in ``pool`` yet, no plan in flight, no service replica, every resident
    one :func:`_may_requeue` allows."""
    st = ps.st
    gs = st.gpus.get(g) or st.gangs.gpus[g]
    if g in ps.touched or g in ps.used or g in ps.held_now or g in pool \
            or gs.pending is not None or st.services.by_gpu.get(g):
        return False
    return all(_may_requeue(ps, j, head) for j in gs.jobs)


def view_room(ps: GangPass, head: str, ents: Mapping[str, float], held: dict[str, float],
              pool: list[str], pick: Picker) -> dict[str, tuple[str, ...]]:
    """GPUs of the policies' view added to ``pool`` (in place) until it holds ``head``: idle
    ones first, then those whose residents may all be requeued (:func:`_may_requeue`) with
    every resident's owner staying at or above its entitlement (``held`` follows), fewest
    residents first, then GPU order; GPU -> the residents to requeue."""
    st = ps.st
    ten = st.tenancy
    assert ten is not None
    spec = st.jobs[head].spec
    cands = [(len(gs.jobs), k, g, tuple(gs.jobs)) for k, (g, gs) in enumerate(st.gpus.items())
             if _may_empty(ps, g, head, pool)]
    freed: dict[str, tuple[str, ...]] = {}
    for _, _, g, res in sorted(cands):
        if pick(pool, spec.num_gpus, spec.nodes) is not None:
            break
        part = ten.split_of(g)
        if any(held.get(o, 0.0) - x < ents.get(o, 0.0) - 1e-6 for o, x in part.items()):
            continue
        for o, x in part.items():
            held[o] = held.get(o, 0.0) - x
        pool.append(g)
        freed[g] = res
    return freed


def _take(ps: GangPass, head: str, ents: Mapping[str, float], cands: list[str],
          pool: list[str], pick: Picker, held: dict[str, float]) -> list[str]:
    """The runs of ``cands`` (in order) to stop until ``pool`` (extended in place with their
    GPUs) holds ``head``; each victim's owner, after the stops before it, still over by a run
    (``held``, GPUs per owner, follows the stops)."""
    st = ps.st
    book, spec = st.gangs, st.jobs[head].spec
    taken: list[str] = []
    for v in cands:
        if len(pool) >= spec.num_gpus and pick(pool, spec.num_gpus, spec.nodes) is not None:
            break
        o, gpus = st.jobs[v].spec.owner, book.runs[v]
        if not _over_by_a_run(held, ents, o, len(gpus)):
            continue  # an earlier stop already brought its owner down to its entitlement
        held[o] = held.get(o, 0.0) - len(gpus)
        taken.append(v)
        pool += [g for g in gpus if g not in ps.used]
    return taken
