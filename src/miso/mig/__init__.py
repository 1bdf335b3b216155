"""MIG hardware model: GPU tables, layout enumeration and validation, transition planning."""

from miso.mig.gpumodel import GpuModel, Profile
from miso.mig.layouts import (
    CURRENT_DRIVER,
    Geometry,
    Layout,
    Placement,
    beside,
    canonical,
    enumerate_layouts,
    geometry,
    is_valid,
    multiset,
    multisets,
    violations,
)
from miso.mig.tabledata import GPU_MODELS
from miso.mig.tables import gpu_model
from miso.mig.transition import TransitionError, TransitionPlan, plan_transition

__all__ = [
    "CURRENT_DRIVER", "GPU_MODELS", "Geometry", "GpuModel", "Layout", "Placement", "Profile",
    "TransitionError", "TransitionPlan", "beside", "canonical", "enumerate_layouts", "geometry",
    "gpu_model", "is_valid", "multiset", "multisets", "plan_transition", "violations",
]
