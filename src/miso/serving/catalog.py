"""The inference-model catalogue and its latency model on every MIG profile of every GPU model.

Each model is given on the reference GPU (A100-40GB, full) by its offline throughput at its
maximum batch and its batch-1 latency (sources beside each number), plus the two MLPerf
Inference v1.1 slice ratios of ``shared/reference/serving.md`` (NVIDIA closed division, same
engines on a 1g slice and a whole A100-80GB):

* ``seven_1g``: throughput of 7 x 1g over the full GPU (0.864-0.907): the slices' efficiency.
* ``latency_cap``: batch-1 latency of 1g over the full GPU (1.41x ResNet-50 .. 7.72x 3D-UNet).

How a profile P (``g`` compute slices of ``G``, ``sm`` of the full GPU's ``SM`` SMs, ``mem`` of
its memory) of GPU model M gets its curve (the scaling rule, one place):

* SM share ``s = sm / SM``; equivalent A100 slices ``g7 = 7 s``.
* efficiency ``e = seven_1g + (1 - seven_1g) (g7 - 1) / 6`` (1 on the full GPU): MLPerf's 7 x 1g
  ratio at one slice, none lost on the whole GPU, linear between.
* throughput ``T = T_A100 x compute_factor(M) x s x e`` (compute factor: datasheet FP16 peak
  ratio to the power 0.65, :mod:`miso.serving.gpuspeed`).
* batch-1 latency ``L1 = L1_A100 / sqrt(compute_factor(M)) x min(7 / g7, latency_cap)``.
* a batch of ``b``: a fixed part plus ``b`` per-item parts, the line through batch 1 at
  ``L1`` and the model's maximum batch at throughput ``T``.
* max batch: the model's, capped by what the slice's memory holds after the weights.

An LLM decoder is memory-bandwidth bound: a batch of ``b`` requests of ``c`` context and ``o``
generated tokens costs a prefill (``2 x params x c x b`` FLOPs at 50 % of the slice's FP16 peak
share ``s e``) plus ``o`` decode steps, each reading the weights and the batch's KV cache at
70 % of the slice's bandwidth share ``mem / MEM``; its batch is capped by the KV cache the
slice's memory holds after the weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

import numpy as np

from miso.mig import gpu_model as _mig_model
from miso.serving.gpuspeed import compute_factor, gpu_speed
from miso.serving.replica import percentile_latency_s, simulate_replica

_GIB = 1024.0**3


@dataclass(frozen=True)
class InferenceModel:
    """One servable model. Compute-bound fields are on the full A100-40GB."""

    name: str
    kind: str  # "compute" or "llm"
    full_throughput_rps: float  # offline, at max_batch, A100-40GB full
    batch1_latency_ms: float  # A100-40GB full
    seven_1g: float  # MLPerf v1.1: 7 x 1g throughput / full
    latency_cap: float  # MLPerf v1.1: batch-1 latency 1g / full
    weights_gb: float  # resident memory before the batch (weights, engine, runtime)
    per_item_gb: float  # activation / KV memory per request in a batch
    max_batch: int
    load_time_s: float
    source: str
    # LLM decoders only
    params: float = 0.0
    context_tokens: int = 0
    generated_tokens: int = 0


_MLPERF = "MLPerf Inference v1.1 closed, NVIDIA A100 MIG vs full (serving.md)"

_MODELS: dict[str, InferenceModel] = {
    "resnet50": InferenceModel(
        "resnet50", "compute",
        full_throughput_rps=36_000.0,  # MLPerf v1.1 DGX A100 offline ~312k/8 GPUs, -8 % 40GB
        batch1_latency_ms=0.9,  # TensorRT INT8 batch 1 on A100 (NVIDIA perf pages, ~0.9 ms)
        seven_1g=0.904, latency_cap=1.41,  # _MLPERF
        weights_gb=1.0, per_item_gb=0.02, max_batch=64,
        load_time_s=5.0,  # small engine (assumed)
        source=_MLPERF + "; throughput/latency: MLPerf v1.1 results, NVIDIA perf pages"),
    "bert-large": InferenceModel(
        "bert-large", "compute",
        full_throughput_rps=3_400.0,  # MLPerf v1.1 DGX A100 BERT-99 offline ~29k/8, -8 %
        batch1_latency_ms=2.0,  # TensorRT INT8 seq 384 batch 1 (NVIDIA perf pages, ~2 ms)
        seven_1g=0.907, latency_cap=3.45,  # _MLPERF
        weights_gb=1.5, per_item_gb=0.05, max_batch=64,
        load_time_s=10.0,  # assumed
        source=_MLPERF + "; throughput/latency: MLPerf v1.1 results, NVIDIA perf pages"),
    "3d-unet": InferenceModel(
        "3d-unet", "compute",
        full_throughput_rps=55.0,  # MLPerf v1.1 DGX A100 3D-UNet-99 offline ~480/8, -8 %
        batch1_latency_ms=25.0,  # offline only in MLPerf; 1.4 x 1/T (assumed)
        seven_1g=0.864, latency_cap=7.72,  # _MLPERF
        weights_gb=2.0, per_item_gb=0.6, max_batch=8,
        load_time_s=15.0,  # assumed
        source=_MLPERF + "; throughput: MLPerf v1.1 results; latency assumed"),
    "llama2-7b": InferenceModel(
        "llama2-7b", "llm",
        full_throughput_rps=0.0, batch1_latency_ms=0.0,  # derived (module docstring)
        seven_1g=0.90, latency_cap=7.0,  # prefill only; LLMs are not in MLPerf v1.1
        weights_gb=13.5 + 1.5,  # 6.74e9 FP16 params + CUDA context/runtime
        per_item_gb=0.5 * 2**20 * 1152 / 1e9,  # KV: 2 x 32 layers x 4096 x 2 B/token (0.5 MiB)
        max_batch=64,
        load_time_s=30.0,  # 20-50 s for large models (Alibaba GenAI trace, serving.md)
        source="Llama 2 paper (6.74e9 params, 32 layers, d=4096); roofline, module docstring",
        params=6.74e9,
        context_tokens=1024,  # nominal request: Azure LLM conv trace, median context ~1k
        generated_tokens=128),  # and ~130 generated tokens (nominal)
}

MODELS: Mapping[str, InferenceModel] = MappingProxyType(_MODELS)


def _model(model: str) -> InferenceModel:
    try:
        return _MODELS[model]
    except KeyError:
        raise KeyError(f"unknown inference model {model!r}; known: {', '.join(_MODELS)}") from None


@dataclass(frozen=True)
class SliceShape:
    """What the latency model reads of one profile of one GPU model."""

    sm_share: float
    mem_share: float
    memory_gb: float


@cache
def slice_shape(gpu_model: str, profile: str) -> SliceShape:
    """SM share, memory share and memory (GB) of ``profile`` on ``gpu_model``."""
    m = _mig_model(gpu_model)
    p = m.profile(profile)
    full = m.full_profile()
    return SliceShape(p.sm_count / full.sm_count, p.memory_gib / full.memory_gib,
                      p.memory_gib * _GIB / 1e9)


def _efficiency(mdl: InferenceModel, sm_share: float) -> float:
    g7 = 7.0 * sm_share
    if g7 >= 7.0 - 1e-9:
        return 1.0
    return mdl.seven_1g + (1.0 - mdl.seven_1g) * max(0.0, g7 - 1.0) / 6.0


@cache
def max_batch(model: str, gpu_model: str, profile: str) -> int:
    """The largest batch ``model`` runs on ``profile`` (0: the slice cannot hold it)."""
    mdl = _model(model)
    shape = slice_shape(gpu_model, profile)
    room = shape.memory_gb - mdl.weights_gb
    if room < mdl.per_item_gb:
        return 0
    return int(min(mdl.max_batch, math.floor(room / mdl.per_item_gb)))


def service_time_s(model: str, gpu_model: str, profile: str, batch: int) -> float:
    """Seconds one batch of ``batch`` requests takes on ``profile`` of ``gpu_model``."""
    if batch < 1:
        return 0.0
    return _service_time_s(model, gpu_model, profile, batch)


@cache
def _service_time_s(model: str, gpu_model: str, profile: str, batch: int) -> float:
    mdl = _model(model)
    shape = slice_shape(gpu_model, profile)
    eff = _efficiency(mdl, shape.sm_share)
    if mdl.kind == "llm":
        speed = gpu_speed(gpu_model)
        flops = speed.fp16_tflops * 1e12 * shape.sm_share * eff * 0.5
        prefill = 2.0 * mdl.params * mdl.context_tokens * batch / flops
        kv_bytes = batch * mdl.per_item_gb * 1e9 * 0.5  # half the KV cache filled on average
        bw = speed.bandwidth_tbps * 1e12 * shape.mem_share * 0.7
        step = (mdl.params * 2.0 + kv_bytes) / bw
        return float(prefill + mdl.generated_tokens * step)
    cf = compute_factor(gpu_model)
    thr = mdl.full_throughput_rps * cf * shape.sm_share * eff
    g7 = 7.0 * shape.sm_share
    lat1 = mdl.batch1_latency_ms / 1000.0 / math.sqrt(cf)
    if g7 < 7.0 - 1e-9:
        lat1 *= min(7.0 / g7, mdl.latency_cap)
    # a line through (1, L1) and (max_batch, max_batch / T): batch 1 costs its latency, the
    # model's largest batch runs at the slice's offline throughput
    mb = mdl.max_batch
    per_item = (mb / thr - lat1) / (mb - 1) if mb > 1 and mb / thr > lat1 else 1.0 / thr
    fixed = max(lat1 - per_item, 0.0)
    return float(fixed + per_item * batch)


def load_time_s(model: str) -> float:
    """Seconds to load ``model`` into a new replica (a resize's price)."""
    return _model(model).load_time_s


#: Requests per capacity measurement (after a warm-up of a tenth) and the seed of their
#: Poisson arrivals: deterministic, so capacities are reproducible.
CAPACITY_REQUESTS = 4000
CAPACITY_SEED = 12345


@cache
def _unit_arrivals() -> np.ndarray:
    rng = np.random.default_rng(CAPACITY_SEED)
    return np.cumsum(rng.exponential(1.0, CAPACITY_REQUESTS))


def tail_latency_s(model: str, gpu_model: str, profile: str, rate_rps: float,
                   percentile: float = 99.0) -> float:
    """The ``percentile`` latency of one replica under Poisson arrivals at ``rate_rps``
    (request-level simulation, :func:`miso.serving.replica.simulate_replica`)."""
    mb = max_batch(model, gpu_model, profile)
    if mb < 1:
        return float("inf")
    arrivals = _unit_arrivals() / rate_rps
    run = simulate_replica(arrivals, lambda b: service_time_s(model, gpu_model, profile, b), mb)
    warm = CAPACITY_REQUESTS // 10
    return percentile_latency_s(run.latency_s[warm:], percentile)


@cache
def capacity_rps(model: str, gpu_model: str, profile: str, slo_p99_ms: float,
                 percentile: float = 99.0) -> float:
    """The highest Poisson rate one replica on ``profile`` sustains with its ``percentile``
    latency within ``slo_p99_ms`` (0.0 if even a lone request misses it or it does not fit).
    Bisection on the request-level simulation, to 0.5 % of the saturation rate."""
    mb = max_batch(model, gpu_model, profile)
    if mb < 1:
        return 0.0
    slo = slo_p99_ms / 1000.0
    if service_time_s(model, gpu_model, profile, 1) > slo:
        return 0.0
    # the best batch that fits the SLO by itself bounds the sustainable rate
    hi = max(b / service_time_s(model, gpu_model, profile, b) for b in range(1, mb + 1)
             if service_time_s(model, gpu_model, profile, b) <= slo)
    lo = 0.0
    for _ in range(24):
        mid = (lo + hi) / 2.0
        if tail_latency_s(model, gpu_model, profile, mid, percentile) <= slo:
            lo = mid
        else:
            hi = mid
        if hi - lo < 0.005 * hi:
            break
    return float(lo)


def fitting_profiles(model: str, gpu_model: str, slo_p99_ms: float,
                     percentile: float = 99.0) -> dict[str, float]:
    """Capacity (req/s) per default profile of ``gpu_model`` that can serve ``model`` at the SLO."""
    out: dict[str, float] = {}
    for p in _mig_model(gpu_model).default_profiles():
        c = capacity_rps(model, gpu_model, p.name, slo_p99_ms, percentile)
        if c > 0.0:
            out[p.name] = c
    return out


def capacity_on_arrivals_rps(model: str, gpu_model: str, profile: str, slo_p99_ms: float,
                             arrivals_s: np.ndarray, percentile: float = 99.0) -> float:
    """Like :func:`capacity_rps`, but for arrivals shaped like ``arrivals_s`` (a recorded
    stream, e.g. a service's own trace): the stream is stretched or compressed in time to
    each candidate rate, so its bursts count. Bisection to 0.5 % of the saturation rate."""
    mb = max_batch(model, gpu_model, profile)
    arr = np.asarray(arrivals_s, dtype=float)
    if mb < 1 or len(arr) < 2 or arr[-1] <= arr[0]:
        return 0.0
    slo = slo_p99_ms / 1000.0
    if service_time_s(model, gpu_model, profile, 1) > slo:
        return 0.0
    arr = arr - arr[0]
    base_rate = len(arr) / arr[-1]

    def bt(b: int) -> float:
        return service_time_s(model, gpu_model, profile, b)

    hi = max(b / bt(b) for b in range(1, mb + 1) if bt(b) <= slo)
    lo = 0.0
    for _ in range(24):
        mid = (lo + hi) / 2.0
        run = simulate_replica(arr * (base_rate / mid), bt, mb)
        if percentile_latency_s(run.latency_s, percentile) <= slo:
            lo = mid
        else:
            hi = mid
        if hi - lo < 0.005 * hi:
            break
    return float(lo)
