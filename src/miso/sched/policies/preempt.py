"""Priorities with preemption, for every policy (on with ``TenancyConfig(preempt=True)``).

A queued job of at least ``preempt_priority`` that the policy could not place, at the head of
the queue, may take the room of lower-priority jobs on ONE GPU: they are checkpointed and
requeued (:class:`~miso.sched.decisions.RequeueJob`, reason and ``why`` say who and why), then
the policy places the queue again (the high job is its head, and that GPU now the only one with
room for it). Victims are chosen by the restart economy: the fewest jobs, then the least GPU
time thrown away (``restart_s`` x the GPU share each holds; a job that cannot checkpoint also
loses its run so far). Never a job that cannot checkpoint (unless
``preempt_uncheckpointable``), never one that started less than ``min_run_s`` ago (preemption
loops are fair-share preemption's known risk), never one of equal or higher priority, never on
a GPU with a plan in flight. Whether the job would fit is the policy's fit test on the
residents that would stay (:meth:`~miso.sched.policies.base.BasePolicy.fits`: its capacity,
then its profile's filters).
"""

from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING

from miso.sched.decisions import RequeueCause

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.policies.base import BasePolicy, Scratch

#: Restart cost (s) a policy without a restart economy prices victims at
#: (:meth:`BasePolicy.restart_price`; miso+ prices each at its learned cost).
DEFAULT_RESTART_S = 60.0
#: At most this many preemptions per decision call.
MAX_PER_CALL = 4


def victim_cost(sc: Scratch, job: str, now: float, restart_s: float) -> float:
    """GPU-seconds a preemption of ``job`` throws away: its restart wait x its GPU share, plus
    its run so far (x share) when it cannot checkpoint."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    share = ten.charge_of(job)
    cost = restart_s * share
    if not st.jobs[job].spec.checkpointable:
        cost += (now - ten.running_since.get(job, now)) * share
    return cost


def preemptible(sc: Scratch, v: str, prio: int, now: float) -> bool:
    """Whether resident ``v`` may be preempted for a job of priority ``prio``: lower
    priority, not placed in this call, running at least ``min_run_s``, able to checkpoint
    (unless ``preempt_uncheckpointable``)."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    cfg = ten.config
    vs = st.jobs[v]
    since = ten.running_since.get(v)
    return not (vs.spec.priority >= prio or v in sc.placed or since is None
                or now - since < cfg.min_run_s
                or (not vs.spec.checkpointable and not cfg.preempt_uncheckpointable))


def choose_victims(policy: BasePolicy, now: float, sc: Scratch, job: str
                   ) -> tuple[str, tuple[str, ...], float] | None:
    """(GPU, victims, cost) with the fewest victims, then the lowest cost, then GPU order; None
    when no allowed set of victims makes room."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    prio = st.jobs[job].spec.priority
    best: tuple[int, float, str, tuple[str, ...]] | None = None
    owner = st.jobs[job].spec.owner
    for g, gs in st.gpus.items():
        if gs.busy or sc.reserved.get(g, owner) != owner:
            continue
        resident = sc.jobs_on(g)
        eligible = [v for v in resident if preemptible(sc, v, prio, now)]
        max_k = len(eligible) if best is None else min(len(eligible), best[0])
        got = _fewest_cheapest(policy, sc, now, job, g, resident, eligible, max_k)
        if got is not None:
            key = (got[0], got[1], g, got[2])
            if best is None or key[:2] < best[:2]:
                best = key
    if best is None:
        return None
    return best[2], best[3], best[1]


def _fewest_cheapest(policy: BasePolicy, sc: Scratch, now: float, job: str, g: str,
                     resident: list[str], eligible: list[str], max_k: int
                     ) -> tuple[int, float, tuple[str, ...]] | None:
    """(k, cost, victims): the cheapest set of the fewest (at most ``max_k``) ``eligible``
    residents of ``g`` whose leaving lets ``job`` pass the policy's fit test."""
    for k in range(1, max_k + 1):
        found: tuple[float, tuple[str, ...]] | None = None
        for vic in combinations(eligible, k):
            rest = [j for j in resident if j not in vic]
            if not policy.fits(sc.cycle, job, g, rest):
                continue    # (with fair share: every protected job keeps its fair slice)
            cost = sum(victim_cost(sc, v, now, policy.restart_price(v)) for v in vic)
            if found is None or cost < found[0] - 1e-9:
                found = (cost, vic)
        if found is not None:
            return k, found[0], found[1]
    return None


def preempt(policy: BasePolicy, now: float, sc: Scratch) -> None:
    """Preempt for the queue's head while it is a high-priority job the policy left queued."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    for _ in range(MAX_PER_CALL):
        head = sc.queue(1)
        if not head:
            return
        j = head[0]
        prio = st.jobs[j].spec.priority
        if prio < ten.config.preempt_priority:
            return
        got = choose_victims(policy, now, sc, j)
        if got is None:
            return
        g, victims, cost = got
        for v in victims:
            sc.requeue(v, f"preempted by {j} (priority {prio} > "
                          f"{st.jobs[v].spec.priority})",
                       why={"trigger": "preemption", "for": j, "gpu": g,
                            "victims": list(victims), "lost_gpu_s": cost,
                            "note": f"{j} (priority {prio}) could not be placed; "
                                    f"{len(victims)} lower-priority job(s) on {g} checkpointed "
                                    f"and requeued, {cost:.0f} GPU-s of restarts"},
                       cause=RequeueCause.PREEMPTED)
        policy.on_capacity(now, sc)
        if j not in sc.placed:
            return
