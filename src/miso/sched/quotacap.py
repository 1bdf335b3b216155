"""In-use quotas as caps on slice sizes: ``max_in_use`` bounds what an owner holds in the
optimizer's slice choice too, not only at admission (issue 26, item 4).

Admission (:meth:`miso.sched.tenancy.Tenancy.order`) offers a queued job to the policy while its
owner's holding plus the job's *smallest* fitting slice stays under the cap; the optimizer could
then give it any slice, a whole idle GPU included (an owner capped at 0.5 GPU-equivalents held
2.0). :func:`capped_speeds` takes away, for each job of a capped owner on the GPU being solved,
the profiles whose GPU-equivalent share would take the owner over its cap, given what it holds
on the other GPUs (its jobs on this GPU share the rest evenly). A job keeps its smallest fitting
profile in any case (admission checked that one). Pure; a run without in-use quotas gets its
``speeds`` back unchanged (the same object).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from miso.mig import Placement

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.state import ClusterState, GpuState
    from miso.sched.tenancy import Tenancy


def capped_speeds(state: ClusterState, gpu: str, speeds: dict[str, dict[str, float]]
                  ) -> dict[str, dict[str, float]]:
    """``speeds`` (job -> profile -> speed on ``gpu``) without the profiles that would take a
    job's owner over its in-use quota (see the module docstring)."""
    ten = state.tenancy
    if ten is None or not ten.config.max_in_use:
        return speeds
    mine = capped_jobs(state, speeds, ten.config.max_in_use)
    if not mine:
        return speeds
    model = state.gpus[gpu].geom.model
    full = model.full_profile().compute_slices
    out = dict(speeds)
    for owner, js in mine.items():
        each = (ten.config.max_in_use[owner] - held_elsewhere(state, gpu, owner)) / len(js)
        for j in js:
            sp = speeds[j]
            share = {p: model.profile(p).compute_slices / full for p in sp}
            kept = within(sp, share, each)
            if len(kept) < len(sp):
                out[j] = kept
    return out


def capped_jobs(state: ClusterState, speeds: dict[str, dict[str, float]],
                caps: Mapping[str, float]) -> dict[str, list[str]]:
    """The jobs of ``speeds`` whose owner has an in-use quota, by owner."""
    mine: dict[str, list[str]] = {}
    for j in speeds:
        if j in state.jobs and state.jobs[j].spec.owner in caps:
            mine.setdefault(state.jobs[j].spec.owner, []).append(j)
    return mine


def held_elsewhere(state: ClusterState, gpu: str, owner: str) -> float:
    """GPU-equivalents ``owner``'s jobs hold on the GPUs other than ``gpu``."""
    from miso.sched.tenancy import job_charge  # noqa: PLC0415 - tenancy calls this module

    jobs = state.jobs
    return sum(job_charge(gs, j) for g, gs in state.gpus.items() if g != gpu
               for j in gs.jobs if jobs[j].spec.owner == owner)


def within(sp: dict[str, float], share: dict[str, float], each: float) -> dict[str, float]:
    """The profiles of ``sp`` whose GPU share is at most ``each``; none fits: the smallest
    (admission's own guarantee)."""
    kept = {p: v for p, v in sp.items() if share[p] <= each + 1e-9}
    if not kept and sp:
        small = min(share.values())
        kept = {p: v for p, v in sp.items() if share[p] <= small + 1e-9}
    return kept


def capped_alone(state: ClusterState, gpu: str, job: str, full: Placement) -> Placement:
    """The slice for ``job`` alone on ``gpu``: ``full`` (the whole GPU), unless its owner's
    in-use quota forbids it: then the largest profile under the cap that holds the job."""
    ten = state.tenancy
    if ten is None or not ten.config.max_in_use:
        return full
    geom = state.gpus[gpu].geom
    mem = state.jobs[job].spec.memory_gb
    fits = {p.name: p for p in geom.profiles if p.memory_gib + 1e-9 >= mem}
    allowed = capped_speeds(state, gpu, {job: dict.fromkeys(fits, 1.0)})[job]
    if full.profile in allowed or not allowed:
        return full
    best = max(allowed, key=lambda n: (fits[n].compute_slices, fits[n].memory_gib, n))
    return Placement(fits[best].starts[0], best)


def reserved_charge(ten: Tenancy, gs: GpuState, job: str, charge: float) -> float:
    """What a capped owner's job holds on ``gs`` while the GPU's layout gives it no slice yet
    (placed, its layout decided in the same instant): the smallest slice admission reserved
    for it, not ``1 / jobs on the GPU`` (a whole idle GPU for a job alone). Other jobs, and
    jobs of owners without a cap: ``charge`` as given."""
    owner = ten.state.jobs[job].spec.owner
    if owner not in ten.config.max_in_use or job in gs.target_assignment() \
            or job in gs.mps_shares or gs.phase.value != "idle":
        return charge
    return min(charge, ten.smallest_charge(job))
