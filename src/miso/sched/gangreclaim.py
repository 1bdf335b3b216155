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

Entitlements here are in whole GPUs: every GPU (the policies' view and the held ones) water-
filled by weight (:func:`~miso.sched.fairfill.two_level_fill`) over owners' demands, each the
GPUs it holds plus those its queued jobs ask for (a one-GPU job one, a gang its ``num_gpus``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from miso.sched.decisions import StopGang
from miso.sched.fairfill import two_level_fill

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.gangs import GangPass
    from miso.sched.state import ClusterState

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
                pick: Picker) -> bool:
    """Stop other owners' whole-GPU runs so ``head`` starts now (module docstring); True when
    it did (``ps.out`` then holds the stops and the start)."""
    st = ps.st
    ten = st.tenancy
    if ten is None or not ten.config.entitled:
        return False
    ents = gang_entitlements(st)
    if not owed(st, head, ents):
        return False
    book, spec = st.gangs, st.jobs[head].spec
    pool = [g for g in book.gpus if g not in ps.used and book.idle(g)]
    taken = _take(ps, head, ents, victims(st, head, ents, backfills, started, ps.now), pool,
                  pick)
    got = pick(pool, spec.num_gpus, spec.nodes)
    need = [v for v in taken if got is not None and set(book.runs[v]) & set(got)]
    if got is None or not need:
        return False
    for v in need:
        ps.out.append(StopGang(v, f"reclaimed for {head} of owner {spec.owner or '(none)'}, "
                                  "below its entitlement"))
    ps.start(head, got, False)
    return True


def _take(ps: GangPass, head: str, ents: Mapping[str, float], cands: list[str],
          pool: list[str], pick: Picker) -> list[str]:
    """The runs of ``cands`` (in order) to stop until ``pool`` (extended in place with their
    GPUs) holds ``head``; each victim's owner, after the stops before it, still over by a run."""
    st = ps.st
    ten = st.tenancy
    assert ten is not None
    book, spec = st.gangs, st.jobs[head].spec
    held = dict(ten.held)
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
