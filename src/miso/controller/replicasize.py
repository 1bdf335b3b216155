"""How big a service's replica is: its capacity on a slice and the memory it asks for.

* :func:`capacity_rps`: requests/s one replica on a profile serves within the service's SLO:
  measured live when the store has it for that profile, else the catalogue's
  (:func:`miso.serving.catalog.capacity_rps`), or for miso's emulated server the slowed-down
  model's (:mod:`miso.serving.emulated`).
* :func:`expected_slowdown`: an emulated server's slowdown before it answers (its command).
* :func:`replica_memory_gb`: the GPU memory a replica asks for, so that the controller's
  policy does not put it on a slice where it would barely serve.
"""

from __future__ import annotations

import contextlib

from miso.controller.servicestore import ServiceRecord
from miso.mig import gpu_model as mig_gpu_model
from miso.serving import catalog, emulated

#: A replica's slice serves at least this share of a whole GPU's capacity at the SLO.
MIN_SLICE_SHARE = 0.25
GIB_GB = 1024.0**3 / 1e9


def capacity_rps(rec: ServiceRecord, profile: str, gpu_model: str = "A100-40GB",
                 slowdown: float = 1.0) -> float:
    """Requests/s one replica on ``profile`` serves within the SLO (see the module)."""
    if rec.capacity_rps and rec.capacity_profile == profile:
        return rec.capacity_rps
    if slowdown > 1.0:
        return emulated.capacity_rps(rec.model, gpu_model, profile or "7g.40gb",
                                     rec.slo_p99_ms, rec.percentile, slowdown)
    return float(catalog.capacity_rps(rec.model, gpu_model, profile or "7g.40gb",
                                      rec.slo_p99_ms, rec.percentile))


def expected_slowdown(rec: ServiceRecord) -> float:
    """miso's own ``miso.emuserve``: its ``--slowdown`` or the default; 1 for any other
    server."""
    cmd = list(rec.command)
    if "miso.emuserve" not in cmd:
        return 1.0
    with contextlib.suppress(ValueError, IndexError):
        if "--slowdown" in cmd:
            return min(max(1.0, float(cmd[cmd.index("--slowdown") + 1])),
                       emulated.MAX_SLOWDOWN)
    return emulated.DEFAULT_SLOWDOWN


def replica_memory_gb(rec: ServiceRecord, gpu_model: str = "A100-40GB") -> float | None:
    """The service's ``--memory-gb``, else just over the next smaller slice's memory below the
    smallest slice on which one replica serves at least :data:`MIN_SLICE_SHARE` of what a
    whole GPU serves at the SLO (None: any slice)."""
    if rec.memory_gb:
        return rec.memory_gb
    slowdown = expected_slowdown(rec)
    try:
        profiles = sorted(mig_gpu_model(gpu_model).default_profiles(),
                          key=lambda p: p.memory_gib)
        caps = [capacity_rps(rec, p.name, gpu_model, slowdown) for p in profiles]
    except (KeyError, ValueError):
        return None
    best = max(caps, default=0.0)
    for i, (p, c) in enumerate(zip(profiles, caps, strict=True)):
        if best > 0 and c >= MIN_SLICE_SHARE * best:
            smaller = [q.memory_gib for q in profiles[:i] if q.memory_gib < p.memory_gib]
            return round(max(smaller) * GIB_GB + 0.5, 2) if smaller else None
    return None
