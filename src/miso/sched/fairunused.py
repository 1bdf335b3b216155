"""An owner's first slice (issue 31): the fair slice a protected owner's job is owed when it
is the owner's only active job (queued or running): what the job would get alone on the
owner's weighted part of the cluster, up to the largest slice below a whole GPU. Pure.

**Why.** The stated price's cap (:mod:`miso.sched.fairprice`) is one size for every job of a
protected owner, priced as if the protected owners' jobs were a sizable part of the work
(fitted to a light owner with 20 % of the jobs). In a flood that cap falls to the smallest
slices, and an owner that runs one job at a time, whose share of the cluster is otherwise
unused, is then owed a 2g slice: measured, Philly by vc at 5 %, vc 11cb48's ~75 s jobs (one
every 600 s inside the largest vc's flood) ran on 2g and 3g slices at about half the speed
of the whole GPU they have alone (sharing incentive 2.00-2.04, the worst owner). Its one job
takes at most its own part of the cluster, so sizing it from that part costs the others no
more than fair share already owes the owner. Measured (seeds 1-3, 5 %): vc 11cb48 2.00 /
2.04 / 2.00 -> 1.40 / 1.40 / 1.40 on 4g slices, price -2.5 / -4.1 / -2.9 % -> +2.8 / -0.4 /
+2.8 % (the largest vc's short jobs' mean slowdown 111 / 110 / 111 -> 171 / 182 / 171: the
reclaims that return the 4g slices restart its jobs).

**Why not a whole GPU.** A whole GPU is returned only when every resident of a GPU ends or
is restarted: measured, this rule with whole GPUs cost +21.7 % total average JCT and left
vc 11cb48 at 1.77 (seed 1; the largest vc's short jobs 392); the largest slice below a whole
GPU (a 4g of an A100) is returned beside other jobs.

**Why only an owner's only active job.** An owner with several jobs is already sized by its
entitlement per job and the price's cap, which the price model was fitted to; applying the
rule to every job of an owner whose part is not filled moved the two owners 80/20 at 1.6x
the cluster (+0.3 to +1.1 points of price, the light owner's sharing incentive up to
+0.019), and to every job of an owner with none running changed the price's own caps for
an owner whose jobs all wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def weighted_part(owner: str, active: Mapping[str, int], weight: Mapping[str, float],
                  capacity: float) -> float:
    """GPUs of ``capacity`` that are ``owner``'s by weight among the owners with active jobs
    (``active``: owner -> its active jobs; ``weight``: owner -> its weight)."""
    tot = sum(weight[o] for o, n in active.items() if n > 0)
    return capacity * weight[owner] / tot if tot > 0 and active.get(owner, 0) > 0 else 0.0


def first_slice(part: float, jobs: int, sizes: Sequence[float]) -> float:
    """The part of a GPU each of ``jobs`` active jobs would get alone on ``part`` GPUs, at
    most the largest of ``sizes`` (profile sizes as parts of a GPU) below a whole GPU; 0 when
    the owner has no jobs."""
    if jobs <= 0 or part <= 0 or not sizes:
        return 0.0
    ordered = sorted(sizes)
    below = ordered[-1] if len(ordered) < 2 else ordered[-2]
    return min(part / jobs, below)


def whole_owed(part: float, jobs: int) -> float:
    """1.0 (a whole GPU) when each of ``jobs`` active jobs would get a whole GPU alone on
    ``part`` GPUs; else 0."""
    return 1.0 if jobs > 0 and part / jobs >= 1.0 - 1e-9 else 0.0
