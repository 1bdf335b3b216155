"""MIG table lookups: a GPU model by name or alias, by PCI device id, by NVML device name.

The rows are :mod:`miso.mig.tabledata` (their shape :mod:`miso.mig.gpumodel`); their public
names are importable from here too, as before the split.
"""

from __future__ import annotations

from miso.mig.gpumodel import INFERABLE, GpuModel, Profile
from miso.mig.tabledata import (
    GPU_MODELS,
    MIG_PARTED,
    NVML_1_SLICE,
    NVML_1_SLICE_ALL_ME,
    NVML_1_SLICE_GFX,
    NVML_1_SLICE_NO_ME,
    NVML_1_SLICE_REV1,
    NVML_1_SLICE_REV2,
    NVML_2_SLICE,
    NVML_2_SLICE_ALL_ME,
    NVML_2_SLICE_GFX,
    NVML_2_SLICE_NO_ME,
    NVML_2_SLICE_REV1,
    NVML_3_SLICE,
    NVML_4_SLICE,
    NVML_4_SLICE_GFX,
    NVML_6_SLICE,
    NVML_7_SLICE,
    NVML_8_SLICE,
    UG_DRV,
    UG_GPUS,
    UG_PROF,
)

__all__ = [
    "GPU_MODELS", "INFERABLE", "MIG_PARTED", "NVML_1_SLICE", "NVML_1_SLICE_ALL_ME",
    "NVML_1_SLICE_GFX", "NVML_1_SLICE_NO_ME", "NVML_1_SLICE_REV1", "NVML_1_SLICE_REV2",
    "NVML_2_SLICE", "NVML_2_SLICE_ALL_ME", "NVML_2_SLICE_GFX", "NVML_2_SLICE_NO_ME",
    "NVML_2_SLICE_REV1", "NVML_3_SLICE", "NVML_4_SLICE", "NVML_4_SLICE_GFX", "NVML_6_SLICE",
    "NVML_7_SLICE", "NVML_8_SLICE", "UG_DRV", "UG_GPUS", "UG_PROF", "GpuModel", "Profile",
    "gpu_model", "model_for_name", "model_for_pci",
]


def _norm(name: str) -> str:
    return name.upper().replace("_", "-").replace(" ", "-")


def gpu_model(name: str) -> GpuModel:
    """Look up a GPU model by name or alias (case-insensitive), with a clear error."""
    key = _norm(name)
    for m in GPU_MODELS.values():
        if key == _norm(m.name) or key in (_norm(a) for a in m.aliases):
            return m
    raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(GPU_MODELS)}")


def model_for_pci(device_id: int) -> GpuModel | None:
    """The table model whose PCI device ids contain ``device_id`` (e.g. 0x20B0)."""
    for m in GPU_MODELS.values():
        if any(int(p, 16) == device_id for p in m.pci_device_ids):
            return m
    return None


def model_for_name(device_name: str) -> GpuModel | None:
    """The model whose ``device_names`` occur in an NVML device name, case-insensitive.

    Only for models the tables have no PCI id for (RTX PRO 5000 / 4500 Blackwell), e.g.
    ``"NVIDIA RTX PRO 5000 Blackwell"``.
    """
    key = device_name.casefold()
    for m in GPU_MODELS.values():
        if any(n.casefold() in key for n in m.device_names):
            return m
    return None
