"""How fast a workload runs on each GPU model, relative to another model (an approximation).

No per-model training speeds of the catalogue workloads were measured (the catalogue holds A100
MIG speeds only), and no public table gives them for these workloads. So the factor is a rule
over public datasheet figures, not data:

* **Hardware ratio** of model ``M`` to the A100-40GB: ``h(M) = sqrt(F(M)/F(A100) x B(M)/B(A100))``,
  the geometric mean of the dense FP16/BF16 tensor throughput ratio ``F`` and the memory
  bandwidth ratio ``B`` (training kernels are a mix of compute- and bandwidth-bound ones). A
  model without datasheet figures here is scaled by its MIG-usable SMs alone
  (``sm_count`` of its full profile, :mod:`miso.mig.tables`, over the A100's 98).
* **Workload sensitivity** ``p`` (Amdahl): the share of a workload's step that speeds up with
  the GPU. From its measured A100 MIG speeds: a slice with ``g`` of 7 compute slices runs at
  ``s_g = 1 / ((1 - p) + p x 7 / g)`` of the full GPU, so ``p = (1/s_g - 1) / (7/g - 1)`` at
  its smallest measured slice (clamped to [0, 1]). A job with no workload known takes
  ``DEFAULT_SENSITIVITY``.
* **Factor** of workload ``w`` on ``M``: ``f(w, M) = 1 / ((1 - p) + p / h(M))``; between two
  models, ``f(w, M) / f(w, ref)``. So a workload that scales with SMs gains nearly the whole
  hardware ratio on an H100 (~2.6x), one bound by its input pipeline or launch overheads
  little (the catalogue's spread on an H100-80GB: 1.02x to 2.61x), which is what makes
  placement by model matter (Gavel, OSDI'20, Fig. 1: a newer GPU's speed-up differs by model).

Datasheet figures (dense FP16/BF16 tensor TFLOPS, memory GB/s), NVIDIA: A100 Tensor Core GPU
datasheet (SXM4 40GB: 312, 1,555; 80GB: 312, 2,039), A30 datasheet (165, 933), H100 datasheet
(SXM5 80GB: 989, 3,350; PCIe 80GB: 756, 2,000; NVL 94GB: 835, 3,900), H200 datasheet (141GB:
989, 4,800). Nothing here was measured by this project.
"""

from __future__ import annotations

import math
from functools import cache

from miso.workloads import catalogue

REFERENCE = "A100-40GB"
#: (dense FP16/BF16 tensor TFLOPS, memory bandwidth GB/s) from NVIDIA's datasheets (above)
DATASHEET: dict[str, tuple[float, float]] = {
    "A100-40GB": (312.0, 1555.0),
    "A100-80GB": (312.0, 2039.0),
    "A30-24GB": (165.0, 933.0),
    "H100-80GB": (989.0, 3350.0),
    "H100-PCIE-80GB": (756.0, 2000.0),
    "H100-94GB": (835.0, 3900.0),
    "H200-141GB": (989.0, 4800.0),
}
#: Sensitivity of a job whose workload is unknown (about the catalogue's median, 0.52)
DEFAULT_SENSITIVITY = 0.5


@cache
def hardware_ratio(model: str) -> float:
    """``h(M)``: model ``M``'s speed-up over the A100-40GB for fully GPU-bound work."""
    from miso.mig import gpu_model

    name = gpu_model(model).name
    if name in DATASHEET:
        f, b = DATASHEET[name]
        f0, b0 = DATASHEET[REFERENCE]
        return math.sqrt(f / f0 * b / b0)
    return gpu_model(name).full_profile().sm_count / gpu_model(REFERENCE).full_profile().sm_count


@cache
def sensitivity(workload: str | None) -> float:
    """``p``: the share of the workload's step that speeds up with the GPU (module docstring)."""
    if workload is None:
        return DEFAULT_SENSITIVITY
    wl = catalogue().get(workload)
    if wl is None or not wl.speed_by_slices:
        return DEFAULT_SENSITIVITY
    g = min(wl.speed_by_slices)
    s = wl.speed_by_slices[g]
    if g >= 7 or s <= 0:
        return DEFAULT_SENSITIVITY
    p = (1.0 / s - 1.0) / (7.0 / g - 1.0)
    return min(1.0, max(0.0, p))


def model_factor(workload: str | None, model: str, reference: str = REFERENCE) -> float:
    """How much faster ``workload`` runs on a whole ``model`` than on a whole ``reference``
    (exactly 1.0 when they are the same model)."""
    if model == reference:
        return 1.0
    return _factor(workload, model) / _factor(workload, reference)


@cache
def _factor(workload: str | None, model: str) -> float:
    p = sensitivity(workload)
    return 1.0 / ((1.0 - p) + p / hardware_ratio(model))
