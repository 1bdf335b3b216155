"""Per-profile speeds of catalogue workloads on any MIG GPU model (an approximation).

The catalogue holds real A100-40GB speeds by compute-slice count (7, 4, 3, 2, 1). For another
model, a profile with ``g`` of the model's ``G`` compute slices gets the A100 speed at
``7 * g / G`` slices, interpolated linearly between measured slice counts (exact on 7-slice
models; on an A30 a 2g of 4 gets the A100 figure at 3.5 slices). A profile fits a job when its
memory (GiB) holds the job's peak memory; on the A100-40GB the measured "does not fit" entries
are kept. Where the A100 did not fit but a bigger-memory model does, the speed is extrapolated
proportionally to compute from the smallest measured slice. Documented as an approximation:
no non-A100 speeds were measured.
"""

from __future__ import annotations

from functools import cache

from miso.mig import Geometry
from miso.workloads import Workload, catalogue

_A100 = "A100-40GB"


def workload_speeds(geom: Geometry, wl: Workload) -> dict[str, float]:
    """Speed relative to the full GPU per profile of ``geom`` that fits ``wl`` (missing = no)."""
    return dict(_workload_speeds(geom, wl.name))


@cache
def _workload_speeds(geom: Geometry, name: str) -> tuple[tuple[str, float], ...]:
    wl = catalogue()[name]
    full = geom.model.full_profile()
    out: list[tuple[str, float]] = []
    exact = geom.model.name == _A100
    mem = workload_memory_gb(wl.name)
    for p in geom.profiles:
        if not exact and p.memory_gib + 1e-9 < mem:
            continue
        x = 7.0 * p.compute_slices / full.compute_slices
        if exact:
            s = wl.speed_by_slices.get(p.compute_slices)
            if s is None:
                continue
        else:
            if abs(x - round(x)) < 1e-9 and round(x) in wl.speed_by_slices:
                s = wl.speed_by_slices[round(x)]
            else:
                s = wl.speed_at(x)
        out.append((p.name, float(min(1.0, max(1e-3, s)))))
    if not any(n == full.name for n, _ in out) and full.memory_gib + 1e-9 >= wl.memory_gb:
        out.append((full.name, 1.0))
    return tuple(out)


@cache
def workload_memory_gb(name: str) -> float:
    """Memory (GB) a workload needs: its measured peak, capped by the memory of the smallest
    A100-40GB profile it ran on (peaks measured on big slices overstate the need: bert_train4
    peaks at 10.2 GB on 7g but ran on the 9.62 GiB 2g.10gb)."""
    from miso.mig import gpu_model

    wl = catalogue()[name]
    a100 = gpu_model(_A100)
    by_g = {p.compute_slices: p.memory_gib for p in a100.default_profiles()}
    ran = [by_g[g] for g in wl.speed_by_slices if g in by_g]
    return min([wl.memory_gb, *ran])


def fits(geom: Geometry, memory_gb: float) -> list[str]:
    """Profiles of ``geom`` whose memory holds ``memory_gb``."""
    return [p.name for p in geom.profiles if p.memory_gib + 1e-9 >= memory_gb]


def prior_speeds(geom: Geometry, memory_gb: float, harmonic: bool = False
                 ) -> dict[str, float]:
    """A prior for a job nobody has profiled yet: the catalogue-average speed (arithmetic, or
    ``harmonic``) on each profile of ``geom`` that holds ``memory_gb`` (1.0 on the whole GPU).
    The arithmetic mean is the expected throughput; the harmonic mean is the speed whose time
    (work / speed) is the expected time, what a plan judged by completion times needs (a fixed
    mix: 1 / E[s] < E[1 / s], so the arithmetic mean makes small slices look too good).
    miso+ plans a newcomer it does not stop anyone to profile with it."""
    return dict(_prior(geom, round(memory_gb, 3), harmonic))


@cache
def _average(geom: Geometry, harmonic: bool) -> tuple[tuple[str, float], ...]:
    acc: dict[str, list[float]] = {}
    for w in catalogue().values():
        for p, s in workload_speeds(geom, w).items():
            acc.setdefault(p, []).append(s)
    if harmonic:
        return tuple((p, len(v) / sum(1.0 / x for x in v)) for p, v in acc.items())
    return tuple((p, sum(v) / len(v)) for p, v in acc.items())


@cache
def _prior(geom: Geometry, memory_gb: float, harmonic: bool) -> tuple[tuple[str, float], ...]:
    fit = {p.name for p in geom.profiles if p.memory_gib + 1e-9 >= memory_gb}  # (as placement)
    out = {p: s for p, s in _average(geom, harmonic) if p in fit}
    full = geom.model.full_profile().name
    if full in fit:
        out[full] = 1.0
    return tuple(out.items())
