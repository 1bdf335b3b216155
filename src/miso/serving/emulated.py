"""The emulated inference server's latency model: the catalogue's, slowed down to fit a CPU.

One resnet50 replica on a 7g.40gb slice serves ~36,000 requests/s in the catalogue
(:mod:`miso.serving.catalog`): a Python load generator, router and server on a small CPU machine
reach about a thousand. So the emulated server (``python -m miso.emuserve``) runs a GPU
``slowdown`` times slower in throughput: every request of a batch costs ``slowdown - 1`` more
per-item times of its slice at the model's offline throughput ``T`` (``max_batch /
service_time(max_batch)``):

    t_D(b) = t(b) + (D - 1) x b / T

so a batch of ``max_batch`` runs at ``T / D`` and batch-1 latency grows by ``(D - 1) / T``.
The shape across slices (a 7g slice ~8x a 1g one, MLPerf's slice ratios) is the catalogue's.
At the default ``D`` = :data:`DEFAULT_SLOWDOWN` (400), resnet50 at a 100 ms p99 SLO serves
~58 requests/s on a 7g.40gb slice, ~22/s on a 4g.20gb, ~12/s on a 3g.20gb and ~3/s on a
2g.10gb (:func:`capacity_rps`; a 1g.5gb misses the SLO: its batch-1 time is 87 ms), which a
Python client on one core drives six times over. ``D`` = 1 is the catalogue itself.

Capacities come from the same request-level simulation as the catalogue's
(:func:`miso.serving.replica.simulate_replica`, Poisson arrivals, bisection): the service manager
reports them per replica on its slice when the replica says it is emulated with ``D``.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from miso.serving import catalog
from miso.serving.replica import percentile_latency_s, simulate_replica

#: The default slowdown of ``python -m miso.emuserve`` (see the module docstring).
DEFAULT_SLOWDOWN = 400.0
MAX_SLOWDOWN = 1e6


def offline_throughput_rps(model: str, gpu_model: str, profile: str) -> float:
    """The catalogue's offline throughput of one replica on ``profile`` (0: does not fit)."""
    mb = catalog.max_batch(model, gpu_model, profile)
    if mb < 1:
        return 0.0
    return mb / catalog.service_time_s(model, gpu_model, profile, mb)


def service_time_s(model: str, gpu_model: str, profile: str, batch: int,
                   slowdown: float = DEFAULT_SLOWDOWN) -> float:
    """Seconds one batch of ``batch`` takes on the emulated, ``slowdown`` x slower slice."""
    if batch < 1:
        return 0.0
    base = catalog.service_time_s(model, gpu_model, profile, batch)
    if slowdown <= 1.0:
        return base
    thr = offline_throughput_rps(model, gpu_model, profile)
    return base + (slowdown - 1.0) * batch / thr if thr > 0 else base


@cache
def capacity_rps(model: str, gpu_model: str, profile: str, slo_p99_ms: float,
                 percentile: float = 99.0, slowdown: float = DEFAULT_SLOWDOWN) -> float:
    """The highest Poisson rate one emulated replica sustains within the SLO (0: none)."""
    if slowdown <= 1.0:
        return catalog.capacity_rps(model, gpu_model, profile, slo_p99_ms, percentile)
    mb = catalog.max_batch(model, gpu_model, profile)
    slo = slo_p99_ms / 1000.0
    if mb < 1:
        return 0.0
    times = [service_time_s(model, gpu_model, profile, b, slowdown) for b in range(mb + 1)]
    fits = [b / times[b] for b in range(1, mb + 1) if times[b] <= slo]
    if not fits:
        return 0.0
    lo, hi = 0.0, max(fits)
    arrivals = _unit_arrivals()
    warm = len(arrivals) // 10
    for _ in range(24):
        mid = (lo + hi) / 2.0
        run = simulate_replica(arrivals / mid, lambda b: times[b], mb)
        if percentile_latency_s(run.latency_s[warm:], percentile) <= slo:
            lo = mid
        else:
            hi = mid
        if hi - lo < 0.005 * hi:
            break
    return float(lo)


@cache
def _unit_arrivals() -> np.ndarray:
    rng = np.random.default_rng(catalog.CAPACITY_SEED)
    return np.cumsum(rng.exponential(1.0, catalog.CAPACITY_REQUESTS))
