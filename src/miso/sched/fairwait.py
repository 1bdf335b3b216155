"""Why a queued job waits under fair share, as data for the drivers' status views: its owner's
GPUs against its entitlement, and the jobs of other owners that fair share puts before it.
Pure; the words (and what a reader who is not an admin may see of them) are the driver's
(:func:`miso.controller.owners.fair_wait_reason`).

A job gets a fair-share wait when fair share is on and either jobs of other owners of the
same priority go before it because those owners used less of their share lately (their
``u/w`` is lower: :meth:`~miso.sched.tenancy.Tenancy.order`), or, with entitlements on, its
owner holds more GPUs than its entitlement plus ``keep_margin`` (not *protected*: its jobs
may not squeeze the fair slices of the owners within theirs, and its borrowed room may be
reclaimed). A job held back by an in-use quota has that reason instead; a job with neither
waits for room (FIFO among equals).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.state import ClusterState


@dataclass(frozen=True)
class FairWait:
    """Why the jobs of one (priority, owner) wait under fair share."""

    owner: str
    #: GPUs the owner holds (each occupied GPU counts 1, split by its owners' charges)
    held: float
    #: GPUs the owner is entitled to (None: entitlements off, fair share orders only)
    entitlement: float | None
    #: the owner holds more than its entitlement (plus ``keep_margin``)
    over: bool
    #: owner -> its queued jobs that go first (same priority, less usage per unit of weight)
    ahead: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "held": self.held, "entitlement": self.entitlement,
                "over": self.over, "ahead": dict(self.ahead)}


def _buckets(state: ClusterState) -> tuple[dict[tuple[int, str], list[str]], dict[str, int]]:
    """(the queued jobs offered to the policy by (priority, owner), FIFO; queued jobs per
    owner). A job held back by a quota is not offered: that is its reason."""
    ten = state.tenancy
    assert ten is not None
    jobs = state.jobs
    held = ten.waiting
    buckets: dict[tuple[int, str], list[str]] = {}
    queued: dict[str, int] = {}
    for j in state.queue:
        spec = jobs[j].spec
        queued[spec.owner] = queued.get(spec.owner, 0) + 1
        if not held or j not in held:
            buckets.setdefault((spec.priority, spec.owner), []).append(j)
    return buckets, queued


def _key(x: tuple[float, float] | float) -> tuple[float, ...]:
    return x if isinstance(x, tuple) else (x,)


def _ahead(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Whether the level ``a`` goes clearly before ``b`` (the account's, then the owner's)."""
    for x, y in zip(a, b, strict=True):
        if x + 1e-9 < y:
            return True
        if y + 1e-9 < x:
            return False
    return False


def fair_waits(state: ClusterState) -> list[tuple[FairWait, list[str]]]:
    """Why queued jobs wait under fair share: one :class:`FairWait` per priority and owner
    with such a reason, and its queued jobs (FIFO). Empty with fair share off."""
    ten = state.tenancy
    if ten is None or not ten.config.fair_share or not state.queue:
        return []
    buckets, queued = _buckets(state)
    now = state.now
    level = {o: _key(ten.levels(o, now)) for _, o in buckets}
    ents = ten.entitlements(queued) if ten.config.entitled else None
    out = []
    for (prio, o), js in buckets.items():
        ahead = {o2: len(js2) for (p2, o2), js2 in buckets.items()
                 if p2 == prio and o2 != o and _ahead(level[o2], level[o])}
        over = ents is not None and not ten.protected(o, ents)
        if ahead or over:
            out.append((FairWait(o, ten.held.get(o, 0.0),
                                 None if ents is None else ents.get(o, 0.0), over, ahead), js))
    return out
