"""How fast each MIG GPU model is next to the A100-40GB, for the serving latency model.

Two numbers per model, from NVIDIA's datasheets (dense FP16/BF16 tensor TFLOPS without
sparsity, HBM/GDDR bandwidth in TB/s). Where a datasheet gives only FP4 or sparse figures
(RTX PRO Blackwell) the dense FP16 value is that figure's published ratio down, marked
"inferred". Compute-bound models (CNNs, BERT, 3D-UNet) scale by ``compute_factor``; an LLM
decoder's token step is memory-bandwidth bound and scales by ``bandwidth_tbps``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The catalogue's curves are given on this GPU (MLPerf-anchored).
REFERENCE_GPU = "A100-40GB"

#: Peak ratios overstate measured serving speed-ups: MLPerf Inference v3.0 shows an H100-SXM
#: about 2.1x an A100 per GPU on BERT offline where its dense FP16 peak is 3.17x. The compute
#: factor is the peak ratio to this power (3.17 ** 0.65 = 2.12).
PEAK_TO_SERVING_EXPONENT = 0.65


@dataclass(frozen=True)
class GpuSpeed:
    """Datasheet peaks of one GPU model (full GPU)."""

    fp16_tflops: float
    bandwidth_tbps: float
    source: str


GPU_SPEEDS: dict[str, GpuSpeed] = {
    "A100-40GB": GpuSpeed(312.0, 1.555, "NVIDIA A100 datasheet (SXM4 40GB)"),
    "A100-80GB": GpuSpeed(312.0, 2.039, "NVIDIA A100 datasheet (SXM4 80GB)"),
    "A30-24GB": GpuSpeed(165.0, 0.933, "NVIDIA A30 datasheet"),
    "H100-80GB": GpuSpeed(989.0, 3.35, "NVIDIA H100 datasheet (SXM5)"),
    "H100-PCIE-80GB": GpuSpeed(756.0, 2.0, "NVIDIA H100 datasheet (PCIe)"),
    "H100-94GB": GpuSpeed(835.0, 3.9, "NVIDIA H100 datasheet (NVL)"),
    "H100-96GB": GpuSpeed(989.0, 4.0, "NVIDIA GH200 datasheet (96GB HBM3 H100), inferred"),
    "GH200-144GB": GpuSpeed(989.0, 4.9, "NVIDIA GH200 datasheet (144GB HBM3e)"),
    "H200-141GB": GpuSpeed(989.0, 4.8, "NVIDIA H200 datasheet (SXM)"),
    "B200-180GB": GpuSpeed(2250.0, 8.0, "NVIDIA HGX B200 datasheet, per GPU"),
    "GB200-186GB": GpuSpeed(2500.0, 8.0, "NVIDIA GB200 NVL72 datasheet, per GPU"),
    "B300-288GB": GpuSpeed(2250.0, 8.0, "NVIDIA HGX B300 datasheet, per GPU (FP16 as B200)"),
    "GB300-288GB": GpuSpeed(2500.0, 8.0, "NVIDIA GB300 NVL72 datasheet, per GPU (FP16 as GB200)"),
    "RTX-PRO-6000": GpuSpeed(500.0, 1.792, "RTX PRO 6000 Blackwell datasheet; FP16 inferred "
                             "from 4000 sparse FP4 TOPS / 8"),
    "RTX-PRO-5000": GpuSpeed(264.0, 1.344, "RTX PRO 5000 Blackwell datasheet; FP16 inferred "
                             "from 2114 sparse FP4 TOPS / 8"),
    "RTX-PRO-4500": GpuSpeed(200.0, 0.896, "RTX PRO 4500 Blackwell datasheet; FP16 inferred "
                             "from 1600 sparse FP4 TOPS / 8"),
}


def gpu_speed(gpu_model: str) -> GpuSpeed:
    """The datasheet peaks of ``gpu_model`` (a name of :data:`miso.mig.GPU_MODELS`)."""
    try:
        return GPU_SPEEDS[gpu_model]
    except KeyError:
        raise KeyError(f"no serving speeds for GPU model {gpu_model!r}; "
                       f"known: {', '.join(GPU_SPEEDS)}") from None


def compute_factor(gpu_model: str) -> float:
    """Full-GPU serving throughput of a compute-bound model relative to the A100-40GB."""
    ratio = gpu_speed(gpu_model).fp16_tflops / GPU_SPEEDS[REFERENCE_GPU].fp16_tflops
    return float(ratio ** PEAK_TO_SERVING_EXPONENT)
