"""Fair share's hold: a waiting protected owner's job keeps one GPU from the others' new jobs
until room frees there for it (issue 31). Pure; called by :mod:`miso.sched.policies.reclaim`.

**Why.** Fair share orders the queue, but a job that goes first and finds no room does not stop
later jobs from taking the room that frees: at saturation the light owner's (or a small
account's) large jobs (a 3g slice or more) wait while the 1g and 2g slices that free go to the
heavy owner's small jobs, so an owner that goes first still gets less than its share (measured:
account B, weight 1 of 3, held 15-20 % of the GPU time with 21-23 large jobs queued). A reclaim
would buy that room with restarts; the hold buys it with the idle time of one GPU's slices
while its residents end.

**The rule.** When a protected owner's first queued job (in the tenancy order) has no room and
no reclaim is made for it, the GPU on which it would fit after the fewest residents end (the
largest slices counted first; then GPU order) is reserved for its owner for the rest of the
call (``Scratch.reserved``: other owners' jobs may not join it; its residents run on). Each
call chooses again, so the hold follows the GPU nearest to having room. The owner's next
queued jobs that have no room hold a GPU each too while the owner is still owed that whole
GPU (its entitlement less what it holds and the first job's slice; each held GPU counted
whole, by its model's weight: counted by the jobs' slices, the held GPUs filled with the
owner's jobs overshot, two owners 2:1 on mixed models -8.4 % for the light one), at most
:data:`MAX_HOLDS` GPUs per owner per call: one held GPU let the other
owners' small jobs take every other slice that freed while a small account's large jobs
waited (measured, accounts 2:1 at saturation: B held 3.4-3.6 of its 5.3 GPUs with 10-17
large jobs queued for up to 17,000 s).

**First room** (:func:`first_room`, asked by reclaim before its fair-slice rule): a waiting
owner that holds nothing at all, whose job needs more than packing's share, is given its
first room by reclaim rather than by a hold: behind a flood of jobs that run for days the
hold's GPU frees no slice large enough for a long time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from miso.mig import Geometry
    from miso.sched.policies.base import BasePolicy, Scratch

#: At most this many GPUs held for one owner per call.
MAX_HOLDS = 4
#: At most this many of an owner's queued jobs looked at for holds per call.
MAX_LOOK = 8


def hold(policy: BasePolicy, sc: Scratch, job: str,
         taken: frozenset[str] = frozenset()) -> str | None:
    """Reserve for ``job``'s owner the GPU where ``job`` fits after the fewest residents end
    (module docstring; not one of ``taken``, held already for the owner's jobs ahead); the
    GPU, or None when no GPU would hold it even empty."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    owner = st.jobs[job].spec.owner
    best: tuple[int, int, str] | None = None
    for k, (g, gs) in enumerate(st.gpus.items()):
        if gs.busy or not _open(sc, g, owner, taken):
            continue
        rest = sorted(sc.jobs_on(g), key=lambda j: (-ten.charge_of(j), j))
        cap = None if best is None else best[0]
        n = 0
        while not policy.fits(sc.cycle, job, g, rest):
            if not rest or (cap is not None and n >= cap):
                n = -1
                break
            rest.pop(0)
            n += 1
        if n < 0:
            continue
        if best is None or (n, k) < best[:2]:
            best = (n, k, g)
    if best is None:
        return None
    sc.reserved[best[2]] = owner
    return best[2]


def _open(sc: Scratch, g: str, owner: str, taken: frozenset[str]) -> bool:
    """Whether ``g`` may be held for ``owner``: not changed in this call, not held for its
    jobs ahead, not reserved for another owner."""
    return g not in sc.touched and g not in taken and sc.reserved.get(g, owner) == owner


def hold_owed(policy: BasePolicy, sc: Scratch, job: str, owed: float) -> list[str]:
    """:func:`hold` for ``job``; then for its owner's next queued jobs with no room, one GPU
    each while the owner is still owed that whole GPU (``owed``, GPUs in tenancy's unit, less
    ``job``'s smallest slice and the GPUs held before: a held GPU keeps all of it from the
    others, so it counts its model's weight), at most :data:`MAX_HOLDS`; the GPUs held."""
    st = sc.state
    ten = st.tenancy
    assert ten is not None
    owner = st.jobs[job].spec.owner
    had = {g for g, o in sc.reserved.items() if o == owner}
    taken: list[str] = []
    g = hold(policy, sc, job)
    if g is None:
        return taken
    taken.append(g)
    left = owed - ten.smallest_charge(job)
    nxt = [j for j in sc.queue() if j != job and st.jobs[j].spec.owner == owner][:MAX_LOOK]
    for j in nxt:
        if len(taken) >= MAX_HOLDS or left < 1.0 - 1e-9:
            break
        if policy.has_room(sc, j):
            continue
        g = hold(policy, sc, j, frozenset(taken))
        if g is None:
            continue
        w = ten.model_weight(st.gpus[g].model)
        if w > left + 1e-9:     # not owed this whole GPU: not held
            if g not in had:
                del sc.reserved[g]
            break
        taken.append(g)
        left -= w
    return taken


def fitting_fractions(geom: Geometry, memory_gb: float) -> list[float]:
    """Parts of a GPU (compute slices over the whole GPU's) of each profile of ``geom`` with
    enough memory for the job (the memory test of
    :func:`~miso.sched.policies.base.fitting_profiles`, unrounded): what first room and
    reclaim's fair-slice rule weigh. (Here, not in ``base``: ``base`` imports reclaim.)"""
    full = geom.model.full_profile().compute_slices
    return [p.compute_slices / full for p in geom.profiles if p.memory_gib + 1e-9 >= memory_gb]


def first_room(sc: Scratch, geom: Geometry, job: str) -> tuple[float, float] | None:
    """(its smallest fitting slice, 0.0), parts of a GPU, when ``job``'s owner holds nothing
    at all and the job needs more than packing's share (``1 / n`` of a GPU at ``n`` active
    jobs per GPU, the smallest slice at least): a reclaim then buys its owner's first room.
    Packing gives such a job nothing now: its slice frees only when several small jobs on
    one GPU have ended
    (measured, Philly by vc at 5 %: vc 11cb48's jobs of ~74 s, which need a 3g slice, first
    in fair share's order at 48 active jobs per GPU, waited up to 3,700 s on the 12 GPUs the
    gangs left, while their fair slice cap, 2g, bought no reclaim). Else None (the
    fair-slice rule decides: ``reclaim._worth``; a job that fits packing's share gets it as
    slices free)."""
    ten = sc.state.tenancy
    assert ten is not None
    spec = sc.state.jobs[job].spec
    if ten.held.get(spec.owner, 0.0) > 1e-9 or ten.in_use.get(spec.owner, 0.0) > 1e-9:
        return None
    fit = fitting_fractions(geom, spec.memory_gb)
    n = max(ten.backlog.value, ten.backlog.last, 1.0)   # active jobs per GPU, now or lately
    least = min(fitting_fractions(geom, 0.0))  # the smallest slice
    if not fit or min(fit) <= max(1.0 / n, least) + 1e-9:
        return None
    return (min(fit), 0.0)
