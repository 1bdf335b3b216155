"""Which running job to checkpoint so that a queued replica job of the head gets a slice.

The live service manager starts a replica as a job queued ahead of every other job
(:attr:`~miso.sched.events.JobSpec.ahead`). When the GPUs have no room for it, one training
job is checkpointed and requeued (behind the replica), and the policy places the replica in the
room it leaves; the training job resumes from its checkpoint when room comes back (a replica
drained at scale-in). This module only chooses that job; pure, no I/O.

The victim: a running, checkpointable job that is not itself ahead (never another replica, never
a gang), on a GPU with no plan in flight, whose leaving lets some maximal MIG layout of the GPU
hold the jobs that stay and the replica, each on a slice with its memory. Preferred, in order: a
GPU that already holds a job ahead (replicas pack together and training keeps the other GPUs),
the victim on the fewest compute slices (the least GPU share its restart throws away: the
restart economy's price), then the newest job.
"""

from __future__ import annotations

from miso.mig.layouts import Geometry, multisets
from miso.sched.state import ClusterState, GpuState, JobState, JobStatus


def holds(geom: Geometry, memory_gib: list[float]) -> bool:
    """Whether some maximal layout of ``geom`` gives every demand its own slice with at least
    its memory (largest demand to largest slice: a threshold matching)."""
    mem = {p.name: p.memory_gib for p in geom.profiles}
    need = sorted(memory_gib, reverse=True)
    for ms in multisets(geom, maximal=True):
        have = sorted((mem[n] for n in ms), reverse=True)
        if len(have) >= len(need) and all(d <= h + 1e-9 for d, h in zip(need, have,
                                                                           strict=False)):
            return True
    return False


def room_victim(state: ClusterState, job: str) -> str | None:
    """The job to checkpoint for queued ``job`` (see the module); None when none makes room
    or ``job`` fits already."""
    js = state.jobs.get(job)
    if js is None or js.status is not JobStatus.QUEUED:
        return None
    need = js.spec.memory_gb
    best: tuple[tuple[bool, int, float, str], str] | None = None
    for gs in state.gpus.values():
        if gs.pending is not None or gs.base is not None:
            continue
        stay = [state.jobs[j] for j in gs.jobs]
        if holds(gs.geom, [s.spec.memory_gb for s in stay] + [need]):
            return None  # room without a checkpoint: the policy's to use
        got = gpu_victim(gs, stay, need)
        if got is not None and (best is None or got[0] < best[0]):
            best = got
    return best[1] if best is not None else None


def may_make_room(v: JobState) -> bool:
    """A running training job that can save: never a replica (``ahead``) nor a gang."""
    spec = v.spec
    return (not spec.ahead and spec.checkpointable and not spec.gang
            and v.status is JobStatus.RUNNING)


def gpu_victim(gs: GpuState, stay: list[JobState], need: float,
               ) -> tuple[tuple[bool, int, float, str], str] | None:
    """The best victim on one GPU with its preference key (smaller is better), or None."""
    packs = any(s.spec.ahead for s in stay)
    best: tuple[tuple[bool, int, float, str], str] | None = None
    for v in stay:
        if not may_make_room(v):
            continue
        rest = [s.spec.memory_gb for s in stay if s is not v] + [need]
        if not holds(gs.geom, rest):
            continue
        slices = gs.geom.model.profile(v.placement.profile).compute_slices \
            if v.placement is not None else gs.geom.model.full_profile().compute_slices
        key = (not packs, slices, -v.submitted_at, v.id)
        if best is None or key < best[0]:
            best = (key, v.id)
    return best
