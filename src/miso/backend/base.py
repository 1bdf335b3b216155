"""GPU backend interface: read and change the MIG layout of one node's GPUs, run MPS on a slice.

Two implementations share this interface: :class:`miso.backend.nvml.NvmlBackend` (real GPUs
through NVML) and :class:`miso.backend.emulated.EmulatedBackend` (GPUs emulated from the hardware
tables, for tests, demos and development without a GPU). The agent only talks to this interface.

Units: placements are :class:`miso.mig.Placement` (start in placement units, profile name).
Errors carry the NVML error kind they correspond to, so callers can react the same way to an
emulated and a real refusal.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from miso.mig import Geometry, Layout, Placement, canonical, geometry, violations


class BackendError(RuntimeError):
    """A GPU operation failed. ``kind`` names the NVML error class (``IN_USE`` ...)."""

    kind = "UNKNOWN"

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class InstanceInUse(BackendError):
    """NVML_ERROR_IN_USE: a process (or a compute instance) still uses the instance."""

    kind = "IN_USE"


class InsufficientResources(BackendError):
    """NVML_ERROR_INSUFFICIENT_RESOURCES: the placement overlaps an existing instance."""

    kind = "INSUFFICIENT_RESOURCES"


class NotSupported(BackendError):
    """NVML_ERROR_NOT_SUPPORTED: MIG is off or unsupported, or the profile is unknown here."""

    kind = "NOT_SUPPORTED"


class InvalidPlacement(BackendError):
    """NVML_ERROR_INVALID_ARGUMENT: the start is not a legal placement of the profile."""

    kind = "INVALID_ARGUMENT"


class NotFound(BackendError):
    """NVML_ERROR_NOT_FOUND: no such instance."""

    kind = "NOT_FOUND"


class ReconfigurationError(BackendError):
    """Applying a layout failed part-way; ``layout`` is what the GPU holds now (read back)."""

    def __init__(self, message: str, *, layout: Layout, cause: BackendError) -> None:
        super().__init__(message, kind=cause.kind)
        self.layout = layout
        self.cause = cause


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU of the node."""

    index: int
    uuid: str
    model: str
    mig_enabled: bool


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (GPU instance plus its full compute instance) and its ``MIG-`` UUID."""

    gpu: int
    placement: Placement
    uuid: str
    gi_id: int = 0
    ci_id: int = 0


@dataclass
class MpsHandle:
    """An MPS control daemon bound to one MIG device; jobs join it via ``pipe_dir``."""

    gpu: int
    placement: Placement
    pipe_dir: str
    log_dir: str
    pid: int | None = None
    extra: dict[str, str] = field(default_factory=dict)


class GpuBackend(ABC):
    """The operations the agent needs on the GPUs of one node.

    Implementations must refuse, as NVML does, to destroy an instance a process still uses
    (:class:`InstanceInUse`) and to create an instance overlapping another
    (:class:`InsufficientResources`).
    """

    name = "abstract"

    @abstractmethod
    def gpus(self) -> list[GpuInfo]:
        """The node's GPUs, by index."""

    @abstractmethod
    def geometry(self, gpu: int) -> Geometry:
        """The MIG geometry (model, profiles, driver rules) of GPU ``gpu``."""

    @abstractmethod
    def possible_placements(self, gpu: int) -> dict[str, tuple[int, ...]]:
        """Profile name -> every legal start, as the device reports it (occupancy ignored)."""

    @abstractmethod
    def devices(self, gpu: int) -> dict[Placement, MigDevice]:
        """The MIG devices that exist now on ``gpu``, by placement."""

    @abstractmethod
    def create(self, gpu: int, placement: Placement) -> MigDevice:
        """Create the GPU instance at exactly ``placement`` and its full compute instance."""

    @abstractmethod
    def destroy(self, gpu: int, placement: Placement) -> None:
        """Destroy the compute instance(s) then the GPU instance at ``placement``."""

    @abstractmethod
    def processes(self, gpu: int, placement: Placement) -> list[int]:
        """PIDs of processes using the MIG device at ``placement``."""

    @abstractmethod
    def start_mps(self, gpu: int, placement: Placement, base_dir: str) -> MpsHandle:
        """Start one MPS control daemon for the MIG device (own pipe and log directories)."""

    @abstractmethod
    def stop_mps(self, handle: MpsHandle) -> None:
        """Stop an MPS daemon started by :meth:`start_mps` (idempotent)."""

    def job_env(self, gpu: int, placement: Placement) -> dict[str, str]:
        """Environment that pins a process to the MIG device at ``placement``."""
        dev = self.devices(gpu).get(placement)
        if dev is None:
            raise NotFound(f"GPU {gpu}: no MIG device at {placement}")
        return {"CUDA_VISIBLE_DEVICES": dev.uuid}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release library handles (optional)."""

    # ---- derived operations -------------------------------------------------------------

    def read_layout(self, gpu: int) -> Layout:
        """The layout the GPU holds now (canonical)."""
        return canonical(self.devices(gpu))

    def apply_layout(self, gpu: int, target: Layout) -> Layout:
        """Change GPU ``gpu`` to ``target``: keep common instances, destroy the rest, create the
        missing ones with explicit placements (largest first).

        No-op when equal. On failure raises :class:`ReconfigurationError` whose ``layout`` is
        the layout read back from the GPU: every layout a GPU can hold is valid, so the caller
        always knows a valid state to continue from.
        """
        geom = self.geometry(gpu)
        tgt = canonical(target)
        problems = violations(geom, tgt)
        if problems:
            raise InvalidPlacement(f"GPU {gpu}: invalid target layout: {'; '.join(problems)}")
        cur = self.read_layout(gpu)
        tgt_set = set(tgt)
        size = {p.name: p.size for p in geom.model.profiles}
        try:
            for pl in cur:
                if pl not in tgt_set:
                    self.destroy(gpu, pl)
            cur_set = set(self.read_layout(gpu))
            for pl in sorted(tgt, key=lambda p: (-size[p.profile], p.start)):
                if pl not in cur_set:
                    self.create(gpu, pl)
        except BackendError as e:
            now = self.read_layout(gpu)
            raise ReconfigurationError(
                f"GPU {gpu}: applying {[str(p) for p in tgt]} failed ({e.kind}: {e}); "
                f"GPU now holds {[str(p) for p in now]}",
                layout=now, cause=e,
            ) from e
        return self.read_layout(gpu)


def default_geometry(model: str) -> Geometry:
    """Scheduler geometry (default profiles, current driver) of a model name."""
    return geometry(model)
