"""Tenancy's queue order: in which order waiting jobs are offered to the policy (priority, fair
share, FIFO), which are held back by an owner's in-use quota, and which submissions a
queued-jobs quota refuses. Reads the usage ledger of :class:`~miso.sched.tenancy.Tenancy`
(the drivers call these through its methods). Pure: no I/O.

**Fair share (Slurm's classic multifactor factor):** ``F = 2^(-U/S)`` where ``U`` is the owner's
decayed usage as a fraction of all owners' and ``S`` its weight as a fraction of all weights.
``F`` falls monotonically in ``u/w`` (the common normalisations cancel), so waiting jobs are
ordered by (priority, highest first) then ``u/w`` (lowest first: Fair Tree's Level FS ``S/U``
gives the same order), then submission time (FIFO within an owner). With accounts
(:mod:`miso.sched.fairfill`) the queue goes by the account's ``u/w`` first, then the owner's.

**Quotas:** ``max_in_use[owner]`` caps the GPU-equivalents an owner holds: a queued job is offered
to the policy only while ``in use + its smallest fitting slice`` stays under the cap (the policy
may then give it a larger slice, within the cap: :mod:`miso.sched.quotacap`; under a policy of
whole GPUs only, ``nopart``, the smallest slice is the whole GPU; a running job is never stopped
for that); otherwise it waits, and :func:`order` records why (``Tenancy.waiting``).
``max_queued[owner]`` caps an owner's queued jobs: a driver refuses a submission over it with
:func:`refuse_submit`'s one-line reason.

**Priorities:** ``high`` (100), ``normal`` (0), ``low`` (-100) or any integer; see
:mod:`miso.sched.policies.preempt` for preemption.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from miso.sched.queueorder import replicas_first
from miso.sched.tenancyconfig import queued_quota_reason

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.tenancy import Tenancy


def level(ten: Tenancy, owner: str, now: float) -> float:
    """``u / w``: decayed usage per unit of entitlement (lower goes first)."""
    return ten.usage_at(owner, now) / ten.config.weight(owner)


def account_level(ten: Tenancy, account: str, now: float) -> float:
    """An account's decayed usage (its owners' together) per unit of its weight."""
    cfg = ten.config
    use = sum(ten.usage_at(o, now) for o in set(ten.usage) | set(ten.in_use)
              if cfg.account_of(o) == account)
    return use / cfg.account_weight(account)


def levels(ten: Tenancy, owner: str, now: float) -> tuple[float, float] | float:
    """The queue order's key for ``owner``: :func:`level`; with accounts (account's level, the
    owner's level within it)."""
    if not ten.config.accounts:
        return level(ten, owner, now)
    return (account_level(ten, ten.config.account_of(owner), now), level(ten, owner, now))


def queued_needs(ten: Tenancy) -> dict[str, float]:
    """Owner -> its queued jobs' smallest slices together (GPU-equivalents): the least its
    waiting jobs demand (:func:`miso.sched.fairfill.floored`)."""
    st = ten.state
    needs: dict[str, float] = {}
    for j in st.queue:
        o = st.jobs[j].spec.owner
        needs[o] = needs.get(o, 0.0) + ten.smallest_charge(j)
    return needs


def factor(ten: Tenancy, owner: str, now: float) -> float:
    """Slurm's classic fair-share factor ``F = 2^(-U/S)`` (1: nothing used; 0.5: used exactly
    its share; for reports: the order uses the equivalent ``u/w``)."""
    owners = set(ten.usage) | set(ten.in_use) | {owner}
    tot_u = sum(ten.usage_at(o, now) for o in owners)
    tot_w = sum(ten.config.weight(o) for o in owners)
    if tot_u <= 0:
        return 1.0
    u = ten.usage_at(owner, now) / tot_u
    s = ten.config.weight(owner) / tot_w
    if not s > 0:  # a share too small for a float (weights 5e-324 beside 1e6): no share
        return 0.0 if u > 0 else 1.0
    return 2.0 ** (-u / s)


def order(ten: Tenancy, queue: Iterable[str], extra_in_use: Mapping[str, float] | None = None,
          ) -> list[str]:
    """The queued jobs ``queue`` (in submission order) as the policy should take them (the
    head's replica jobs, ``ahead``, first): priority, then fair share (when on), then FIFO;
    jobs whose owner is at its in-use quota are left out (``ten.waiting`` says why).
    ``extra_in_use``: GPU-equivalents an owner took or released in the current ``decide`` call
    that the ledger does not show yet."""
    out = ranked(ten, list(queue))
    ten.waiting = {}
    if not ten.config.max_in_use:
        return out
    return within_quota(ten, out, extra_in_use)


def ranked(ten: Tenancy, queue: list[str]) -> list[str]:
    """``queue`` by priority, then fair share (when on), then FIFO, the head's replica jobs
    (``ahead``) first."""
    st = ten.state
    cfg = ten.config
    now = st.now
    keys_of: dict[str, tuple[float, float] | float] = {}
    buckets: dict[tuple[int, str], list[str]] = {}
    for j in queue:
        spec = st.jobs[j].spec
        o = spec.owner
        if o not in keys_of:
            keys_of[o] = levels(ten, o, now) if cfg.fair_share else 0.0
        buckets.setdefault((spec.priority, o), []).append(j)
    # Within a priority, owners by level (their account's first, with accounts) then by
    # their oldest job (FIFO between equals).
    keys = sorted(buckets, key=lambda k: (-k[0], keys_of[k[1]],
                                          st.jobs[buckets[k][0]].submitted_at,
                                          buckets[k][0]))
    if not cfg.fair_share:
        # Priority, then the queue's own (FIFO) order: a stable sort.
        out = sorted(queue, key=lambda x: -st.jobs[x].spec.priority)
    else:
        out = [j for k in keys for j in buckets[k]]
    return replicas_first(out, st.jobs)  # the head's replica jobs first (queueorder.py)


def within_quota(ten: Tenancy, out: list[str], extra_in_use: Mapping[str, float] | None,
                 ) -> list[str]:
    """The jobs of ``out`` (in order) whose owner stays within its in-use quota; the others
    are left out with a reason in ``ten.waiting``."""
    st = ten.state
    cfg = ten.config
    used = dict(ten.in_use)
    for o, c in (extra_in_use or {}).items():
        used[o] = used.get(o, 0.0) + c
    kept = []
    for j in out:
        js = st.jobs[j]
        o = js.spec.owner
        cap = cfg.max_in_use.get(o)
        if cap is None:
            kept.append(j)
            continue
        need = ten.smallest_charge(j)
        if used.get(o, 0.0) + need > cap + 1e-9:
            ten.waiting[j] = (f"owner {o or '(none)'} holds {used.get(o, 0.0):.2f} of its "
                              f"{cap:g} GPU-equivalent quota; this job needs at least "
                              f"{need:.2f}")
            continue
        used[o] = used.get(o, 0.0) + need
        kept.append(j)
    return kept


def refuse_submit(ten: Tenancy, owner: str) -> str | None:
    """The one-line reason to refuse a new job of ``owner`` (queued quota), or None."""
    cap = ten.config.max_queued.get(owner)
    if cap is None:
        return None
    st = ten.state
    return queued_quota_reason(
        owner, sum(1 for j in st.queue if st.jobs[j].spec.owner == owner), cap)
