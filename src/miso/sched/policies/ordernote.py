"""What priority or fair share changed in the order, in words, for the decision log: the jobs
queued before a placed job, still waiting, that the order put after it, as owners and counts
(a non-admin's view shows other users' jobs only as counts, so no job ids). Pure."""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.state import ClusterState


def order_note(state: ClusterState, placed: Set[str], job: str) -> dict[str, str] | None:
    """``{"order": words}`` when tenancy is on and ``job``'s priority or its owner's fair
    share put it before jobs queued earlier that still wait (``placed``: jobs placed in this
    call); None otherwise (FIFO, or only backfill passed them)."""
    if state.tenancy is None:
        return None
    by_prio, by_fair = passed(state, placed, job)
    if not by_prio and not by_fair:
        return None
    js = state.jobs[job]
    who = f"{js.spec.owner or '(none)'}'s job"
    parts = []
    if by_prio:
        parts.append(f"priority {js.spec.priority}: starts {who} before {counts(by_prio)} of "
                     f"lower priority queued earlier")
    if by_fair:
        parts.append(f"fair share: starts {who} before {counts(by_fair)} queued earlier "
                     f"(owners who used more of their share)")
    return {"order": "; ".join(parts)}


def passed(state: ClusterState, placed: Set[str], job: str
           ) -> tuple[dict[str, int], dict[str, int]]:
    """Per owner, the jobs queued before ``job`` that still wait and that the order put after
    it: (by priority, by fair share). Tenancy on."""
    ten = state.tenancy
    assert ten is not None
    js = state.jobs[job]
    owner, prio, t0 = js.spec.owner, js.spec.priority, js.submitted_at
    fair = ten.config.fair_share
    level: dict[str, float] = {}
    by_prio: dict[str, int] = {}
    by_fair: dict[str, int] = {}
    for k in state.queue:
        ks = state.jobs[k]
        if ks.submitted_at > t0:
            break
        if k == job or k in placed:
            continue
        o = ks.spec.owner
        if ks.spec.priority < prio:
            by_prio[o] = by_prio.get(o, 0) + 1
        elif fair and ks.spec.priority == prio and o != owner:
            for x in (o, owner):
                if x not in level:
                    level[x] = ten.level(x, state.now)
            if level[o] > level[owner] + 1e-9:
                by_fair[o] = by_fair.get(o, 0) + 1
    return by_prio, by_fair


def counts(by_owner: dict[str, int]) -> str:
    """``{"alice": 37, "carol": 2}`` -> "37 jobs of alice, 2 of carol" (three owners at most,
    then the rest together)."""
    items = sorted(by_owner.items(), key=lambda kv: (-kv[1], kv[0]))
    words = [f"{n} job{'s' if n != 1 else ''} of {o or '(none)'}" if i == 0
             else f"{n} of {o or '(none)'}" for i, (o, n) in enumerate(items[:3])]
    if len(items) > 3:
        words.append(f"{sum(n for _, n in items[3:])} of {len(items) - 3} other owners")
    return ", ".join(words)
