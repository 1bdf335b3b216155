"""Two submit options checked before a job is stored (issue 33): ``--profile`` (the job is
pinned to one MIG profile: :mod:`miso.sched.pinning`) and ``--after`` (it waits for other jobs
to end: :mod:`miso.sched.dependencies`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miso.controller.runtime import SubmitError
from miso.controller.schema import GIB_PER_GB
from miso.mig import Geometry

#: Jobs one job may wait for.
MAX_AFTER = 64


def pinned_memory(profile: str, gib: float, geoms: Sequence[Geometry]) -> tuple[float, float]:
    """(GiB, GB) of a job pinned to ``profile``: the slice's memory (the job holds all of
    it, and the policies' fit tests then see it as large as its slice). A profile no GPU
    model of the cluster has, or smaller than the memory the job asked for, is refused."""
    sizes = {p.memory_gib for g in geoms for p in g.profiles if p.name == profile}
    if not sizes:
        known = sorted({p.name for g in geoms for p in g.profiles})
        raise SubmitError(f"--profile {profile}: no GPU of this cluster has that MIG profile "
                          f"(it has {', '.join(known)})")
    mem = min(sizes)
    if gib > mem + 1e-9:
        raise SubmitError(f"--profile {profile} has {mem:g} GiB; the job asks for "
                          f"{gib:.2f} GiB")
    return mem, mem / GIB_PER_GB


def dependency_ids(store: Any, after: Sequence[str], owner: str | None) -> list[str]:
    """The job ids of ``after`` (ids, or names among ``owner``'s jobs), each an existing job
    (ended ones too: such a dependency is already met)."""
    if len(after) > MAX_AFTER:
        raise SubmitError(f"--after names {len(after)} jobs; at most {MAX_AFTER}")
    out: list[str] = []
    for a in after:
        try:
            rec = store.get(str(a), owner=owner)
        except (KeyError, ValueError):
            raise SubmitError(f"--after {a}: no such job") from None
        if rec.id not in out:
            out.append(rec.id)
    return out
