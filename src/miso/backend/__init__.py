"""GPU backends: real GPUs through NVML, or GPUs emulated from the MIG hardware tables."""

from miso.backend.base import (
    BackendError,
    GpuBackend,
    GpuInfo,
    InstanceInUse,
    InsufficientResources,
    InvalidPlacement,
    MigDevice,
    MpsHandle,
    NotFound,
    NotSupported,
    ReconfigurationError,
)
from miso.backend.emulated import EmulatedBackend

__all__ = [
    "BackendError", "EmulatedBackend", "GpuBackend", "GpuInfo", "InstanceInUse",
    "InsufficientResources", "InvalidPlacement", "MigDevice", "MpsHandle", "NotFound",
    "NotSupported", "ReconfigurationError",
]
