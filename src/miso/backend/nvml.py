"""Real GPUs through NVML (nvidia-ml-py). The only module of miso that talks to pynvml.

The pynvml module is injected through the constructor (``NvmlBackend(nvml=...)``) so the backend
can be tested against a fake built on the hardware tables (:mod:`tests/fakenvml.py`).

What it does, with the pynvml names (see the project's MIG notes, section 4):

* model: ``nvmlDeviceGetPciInfo().pciDeviceId >> 16`` matched to the tables' PCI ids (profile IDs
  are per device, so the table is chosen by device, never by profile name); driver major from
  ``nvmlSystemGetDriverVersion`` (pre-R510 drivers refuse 4g+3g on A100);
* MIG mode: ``nvmlDeviceGetMigMode`` -> ``[current, pending]``;
* profiles and placements: ``nvmlDeviceGetGpuInstanceProfileInfo(dev, index)`` and
  ``nvmlDeviceGetGpuInstancePossiblePlacements`` (all placements, occupancy ignored);
* create: ``nvmlDeviceCreateGpuInstanceWithPlacement`` (never driver-chosen placement), then the
  full compute instance via ``nvmlGpuInstanceGetComputeInstanceProfileInfo`` +
  ``nvmlGpuInstanceCreateComputeInstance``;
* destroy: every compute instance (``nvmlComputeInstanceDestroy``) then the GPU instance
  (``nvmlGpuInstanceDestroy``); ``IN_USE`` when processes still run there;
* MIG UUIDs: ``nvmlDeviceGetMigDeviceHandleByIndex`` + ``nvmlDeviceGetGpuInstanceId`` +
  ``nvmlDeviceGetUUID``; processes: ``nvmlDeviceGetComputeRunningProcesses`` on the MIG handle;
* MPS: one ``nvidia-cuda-mps-control -d`` per MIG device (:mod:`miso.backend.mps`).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any

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
)
from miso.backend.mps import MpsManager
from miso.mig import Geometry, GpuModel, Placement, geometry, gpu_model
from miso.mig.tables import model_for_name, model_for_pci

#: GPU-instance compute slices -> NVML compute-instance profile index of the full CI.
CI_INDEX_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlBackend(GpuBackend):
    """GPU backend over NVML. ``nvml`` defaults to the real ``pynvml`` module."""

    name = "nvml"

    def __init__(self, nvml: Any = None, *, model: str | None = None,
                 mps: MpsManager | None = None, gpus: list[int] | None = None) -> None:
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 - the only pynvml import in miso
        self._n = nvml
        self._lock = threading.RLock()
        self._mps = mps or MpsManager()
        self._call(self._n.nvmlInit, "initialise NVML")
        count = self._call(self._n.nvmlDeviceGetCount, "count GPUs")
        idx = gpus if gpus is not None else list(range(count))
        self._handles = [self._call(self._n.nvmlDeviceGetHandleByIndex, "open GPU", i)
                         for i in idx]
        try:
            drv = _text(self._n.nvmlSystemGetDriverVersion())
            self._driver = int(drv.split(".")[0])
        except Exception:  # noqa: BLE001 - unknown driver: assume a current one
            self._driver = None
        self._models: list[GpuModel] = []
        self._geoms: list[Geometry] = []
        for i, h in enumerate(self._handles):
            m = gpu_model(model) if model else self._detect_model(i, h)
            self._models.append(m)
            self._geoms.append(self._discover_geometry(i, h, m))

    # ---- helpers ------------------------------------------------------------------------

    def _error(self, e: Exception, what: str) -> BackendError:
        n = self._n
        v = getattr(e, "value", None)
        table: dict[Any, type[BackendError]] = {
            n.NVML_ERROR_IN_USE: InstanceInUse,
            n.NVML_ERROR_INSUFFICIENT_RESOURCES: InsufficientResources,
            n.NVML_ERROR_NOT_SUPPORTED: NotSupported,
            n.NVML_ERROR_INVALID_ARGUMENT: InvalidPlacement,
            n.NVML_ERROR_NOT_FOUND: NotFound,
        }
        cls = table.get(v, BackendError)
        return cls(f"NVML: {what}: {e}")

    def _call(self, fn: Any, what: str, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._n.NVMLError as e:
            raise self._error(e, what) from e

    def _detect_model(self, i: int, h: Any) -> GpuModel:
        pci = self._call(self._n.nvmlDeviceGetPciInfo, f"GPU {i}: read PCI info", h)
        dev_id = int(pci.pciDeviceId) >> 16
        m = model_for_pci(dev_id)
        if m is None:
            name = _text(self._call(self._n.nvmlDeviceGetName, f"GPU {i}: read name", h))
            m = model_for_name(name)
            if m is None:
                raise NotSupported(f"GPU {i} ({name}, PCI 0x{dev_id:04X}) is not in miso's MIG "
                                   f"tables; pass model=... to force one")
        return m

    def _discover_geometry(self, i: int, h: Any, m: GpuModel) -> Geometry:
        """Keep the table's default profiles that this device reports with the same ID."""
        names = []
        for p in m.default_profiles():
            if p.nvml_index is None:
                continue
            try:
                info = self._n.nvmlDeviceGetGpuInstanceProfileInfo(h, p.nvml_index)
            except self._n.NVMLError:
                continue  # not supported by this driver/device
            if int(info.id) != p.profile_id:
                raise NotSupported(f"GPU {i}: NVML reports profile id {info.id} for index "
                                   f"{p.nvml_index}, table says {p.profile_id} ({p.name})")
            names.append(p.name)
        return geometry(m, names, driver=self._driver)

    def _handle(self, gpu: int) -> Any:
        if not 0 <= gpu < len(self._handles):
            raise NotFound(f"no GPU {gpu} (have {len(self._handles)})")
        return self._handles[gpu]

    def _gpu_instances(self, gpu: int) -> dict[Placement, tuple[Any, int]]:
        """Placement -> (GI handle, GI id) of every GPU instance on ``gpu``."""
        n, h, m = self._n, self._handle(gpu), self._models[gpu]
        out: dict[Placement, tuple[Any, int]] = {}
        for p in m.profiles:
            arr = (n.c_nvmlGpuInstance_t * p.max_count)()
            count = ctypes.c_uint(p.max_count)
            try:
                n.nvmlDeviceGetGpuInstances(h, p.profile_id, arr, ctypes.pointer(count))
            except n.NVMLError:
                continue  # profile not supported here
            for gi in arr[: count.value]:
                info = self._call(n.nvmlGpuInstanceGetInfo, f"GPU {gpu}: GI info", gi)
                out[Placement(int(info.placement.start), p.name)] = (gi, int(info.id))
        return out

    def _mig_handles(self, gpu: int) -> dict[int, tuple[Any, int, str]]:
        """GI id -> (MIG device handle, CI id, MIG UUID)."""
        n, h = self._n, self._handle(gpu)
        out: dict[int, tuple[Any, int, str]] = {}
        for i in range(self._call(n.nvmlDeviceGetMaxMigDeviceCount, "max MIG devices", h)):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except n.NVMLError:
                continue  # NOT_FOUND for empty indexes
            gi_id = self._call(n.nvmlDeviceGetGpuInstanceId, "MIG GI id", mig)
            ci_id = self._call(n.nvmlDeviceGetComputeInstanceId, "MIG CI id", mig)
            out[int(gi_id)] = (mig, int(ci_id), _text(self._call(n.nvmlDeviceGetUUID, "UUID", mig)))
        return out

    # ---- interface ----------------------------------------------------------------------

    def gpus(self) -> list[GpuInfo]:
        out = []
        for i, h in enumerate(self._handles):
            cur = self._call(self._n.nvmlDeviceGetMigMode, f"GPU {i}: MIG mode", h)[0]
            uuid = _text(self._call(self._n.nvmlDeviceGetUUID, f"GPU {i}: UUID", h))
            out.append(GpuInfo(i, uuid, self._models[i].name,
                               cur == self._n.NVML_DEVICE_MIG_ENABLE))
        return out

    def mig_enabled(self, gpu: int) -> bool:
        """True when MIG mode is currently on (a pending change needs a GPU reset)."""
        cur = self._call(self._n.nvmlDeviceGetMigMode, f"GPU {gpu}: MIG mode", self._handle(gpu))
        return cur[0] == self._n.NVML_DEVICE_MIG_ENABLE

    def geometry(self, gpu: int) -> Geometry:
        self._handle(gpu)
        return self._geoms[gpu]

    def possible_placements(self, gpu: int) -> dict[str, tuple[int, ...]]:
        n, h = self._n, self._handle(gpu)
        out = {}
        for p in self._models[gpu].profiles:
            count = ctypes.c_uint(0)
            try:
                n.nvmlDeviceGetGpuInstancePossiblePlacements(h, p.profile_id, None,
                                                             ctypes.pointer(count))
                arr = (n.c_nvmlGpuInstancePlacement_t * count.value)()
                n.nvmlDeviceGetGpuInstancePossiblePlacements(h, p.profile_id, arr,
                                                             ctypes.pointer(count))
            except n.NVMLError:
                continue
            out[p.name] = tuple(int(x.start) for x in arr[: count.value])
        return out

    def devices(self, gpu: int) -> dict[Placement, MigDevice]:
        with self._lock:
            gis = self._gpu_instances(gpu)
            migs = self._mig_handles(gpu)
        out = {}
        for pl, (_gi, gi_id) in gis.items():
            _mig, ci_id, uuid = migs.get(gi_id, (None, 0, ""))
            out[pl] = MigDevice(gpu, pl, uuid, gi_id=gi_id, ci_id=ci_id)
        return out

    def create(self, gpu: int, placement: Placement) -> MigDevice:
        n, h = self._n, self._handle(gpu)
        with self._lock:
            if not self.mig_enabled(gpu):
                raise NotSupported(f"GPU {gpu}: MIG mode is off; cannot create {placement}")
            try:
                prof = self._models[gpu].profile(placement.profile)
            except KeyError as e:
                raise NotSupported(f"GPU {gpu}: {e.args[0]}") from None
            what = f"GPU {gpu}: create {placement}"
            pl = n.c_nvmlGpuInstancePlacement_t(placement.start, prof.size)
            gi = self._call(n.nvmlDeviceCreateGpuInstanceWithPlacement, what, h,
                            prof.profile_id, ctypes.pointer(pl))
            try:
                ci_info = self._call(n.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                                     what + " (CI profile)", gi,
                                     CI_INDEX_BY_SLICES[prof.compute_slices],
                                     n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                self._call(n.nvmlGpuInstanceCreateComputeInstance, what + " (CI)", gi,
                           ci_info.id)
            except BackendError:
                # do not leave a GI without a compute instance behind
                with contextlib.suppress(n.NVMLError):
                    n.nvmlGpuInstanceDestroy(gi)
                raise
            return self.devices(gpu)[placement]

    def destroy(self, gpu: int, placement: Placement) -> None:
        n = self._n
        with self._lock:
            gis = self._gpu_instances(gpu)
            if placement not in gis:
                raise NotFound(f"GPU {gpu}: no GPU instance at {placement} to destroy")
            gi, _ = gis[placement]
            what = f"GPU {gpu}: destroy {placement}"
            for idx in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                try:
                    info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, idx, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                except n.NVMLError:
                    continue
                size = max(1, int(info.instanceCount))
                arr = (n.c_nvmlComputeInstance_t * size)()
                count = ctypes.c_uint(size)
                self._call(n.nvmlGpuInstanceGetComputeInstances, what + " (list CIs)", gi,
                           info.id, arr, ctypes.pointer(count))
                for ci in arr[: count.value]:
                    self._call(n.nvmlComputeInstanceDestroy, what + " (CI)", ci)
            self._call(n.nvmlGpuInstanceDestroy, what, gi)

    def processes(self, gpu: int, placement: Placement) -> list[int]:
        dev = self.devices(gpu).get(placement)
        if dev is None:
            return []
        mig = self._mig_handles(gpu).get(dev.gi_id)
        if mig is None:
            return []
        procs = self._call(self._n.nvmlDeviceGetComputeRunningProcesses,
                           f"GPU {gpu}: processes on {placement}", mig[0])
        return [int(p.pid) for p in procs]

    def start_mps(self, gpu: int, placement: Placement, base_dir: str) -> MpsHandle:
        dev = self.devices(gpu).get(placement)
        if dev is None or not dev.uuid:
            raise NotFound(f"GPU {gpu}: no MIG device at {placement} for MPS")
        return self._mps.start(gpu, placement, dev.uuid, base_dir)

    def stop_mps(self, handle: MpsHandle) -> None:
        self._mps.stop(handle)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._n.nvmlShutdown()
