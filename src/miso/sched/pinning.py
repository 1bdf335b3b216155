"""Jobs pinned to one MIG profile (``miso submit --profile 3g.20gb``, as Kubernetes'
``nvidia.com/mig-3g.20gb`` or a Slurm GRES type): ``JobSpec.profile``. The optimizing
policies see such a job with a speed on that profile only, so every plan gives it exactly
that slice (:func:`pinned_speeds`, in ``Scratch.entitled_speeds``, the one filter of the
speeds before the optimizer), and a pinned job alone on a GPU gets its profile, not the
whole GPU (:func:`pinned_alone`). A GPU whose model lacks the profile offers it nothing (the
optimizer finds no layout; the policy requeues it). Policies that do not choose slices
(NoPart, MPS-only, OptSta's fixed layout) run it as any other job of its memory. Before its
first plan the job may be profiled under MPS on the whole GPU, as any newcomer.
"""

from __future__ import annotations

from miso.mig import Geometry, Placement
from miso.sched.state import ClusterState


def pinned_speeds(state: ClusterState, speeds: dict[str, dict[str, float]]
                  ) -> dict[str, dict[str, float]]:
    """``speeds`` (job -> profile -> speed) with each pinned job's speeds cut to its
    profile (empty when the GPU has no such profile); the same object when none is pinned."""
    jobs = state.jobs
    out = None
    for j, sp in speeds.items():
        js = jobs.get(j)
        p = js.spec.profile if js is not None else None
        if p is not None and (len(sp) != 1 or p not in sp):
            if out is None:
                out = dict(speeds)
            out[j] = {p: sp[p]} if p in sp else {}
    return speeds if out is None else out


def pinned_alone(state: ClusterState, gpu: str, job: str, full: Placement) -> Placement:
    """The slice for ``job`` alone on ``gpu``: ``full`` unless the job is pinned to a profile
    of the GPU's model, then that profile at its first start."""
    p = state.jobs[job].spec.profile
    geom = state.gpus[gpu].geom
    if p is None or p == full.profile or not has_profile(geom, p):
        return full
    return Placement(geom.model.profile(p).starts[0], p)


def has_profile(geom: Geometry, name: str) -> bool:
    """Whether ``name`` is a MIG profile of ``geom``."""
    return any(p.name == name for p in geom.profiles)
