"""A fake of the pynvml calls :class:`miso.backend.nvml.NvmlBackend` uses, built on the tables.

It behaves like NVML where the backend depends on it: ``*PossiblePlacements`` returns every
placement (occupancy ignored); creating a GPU instance checks the placement table
(``INVALID_ARGUMENT``), overlap and instance counts (``INSUFFICIENT_RESOURCES``) and MIG mode
(``NOT_SUPPORTED``); destroying a compute instance with processes, or a GPU instance with compute
instances or processes, gives ``IN_USE``. Handles of GPU/compute instances are real ctypes
pointers (to fake addresses, never dereferenced) so they fit in the ctypes arrays pynvml uses.
Errors are pynvml's own ``NVMLError`` classes. Test hooks: :meth:`FakeNvml.add_process`,
:meth:`FakeNvml.fail_next`, :meth:`FakeNvml.report_profile` / :meth:`FakeNvml.hide_profile`
(make the reported profile tables disagree with miso's), ``pending_mig`` and
``driver_loaded=False`` (``nvmlInit`` fails as on a machine without the NVIDIA driver).
Nothing here touches a GPU or loads the NVML library.
"""

from __future__ import annotations

import ctypes
import itertools
import uuid
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pynvml as _p

from miso.mig import Profile, gpu_model


@dataclass
class _Gi:
    id: int
    profile_id: int
    start: int
    size: int
    slices: int
    handle: Any = None
    cis: dict[int, _Ci] = field(default_factory=dict)


@dataclass
class _Ci:
    id: int
    profile_id: int
    gi: _Gi
    uuid: str
    handle: Any = None
    pids: list[int] = field(default_factory=list)


@dataclass
class _Gpu:
    index: int
    model: Any
    mig_mode: int
    uuid: str
    pending_mig: int = 0
    gis: dict[int, _Gi] = field(default_factory=dict)
    next_gi: int = 1


@dataclass
class _Mig:
    gpu: _Gpu
    ci: _Ci


class FakeNvml:
    """Stands in for the ``pynvml`` module (pass it as ``NvmlBackend(nvml=FakeNvml(...))``)."""

    NVMLError = _p.NVMLError
    c_nvmlGpuInstancePlacement_t = _p.c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = _p.c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = _p.c_nvmlComputeInstance_t

    def __init__(self, count: int = 1, model: str = "A100-40GB", *,
                 driver: str = "550.54.15", mig_enabled: bool = True,
                 pending_mig: bool | None = None, driver_loaded: bool = True,
                 nvml_version: str | None = None) -> None:
        for k in dir(_p):
            if k.startswith(("NVML_ERROR_", "NVML_DEVICE_MIG_", "NVML_COMPUTE_INSTANCE_",
                             "NVML_GPU_INSTANCE_")):
                setattr(self, k, getattr(_p, k))
        self._model = gpu_model(model)
        self._driver = driver
        self._driver_loaded = driver_loaded
        self._nvml_version = nvml_version or f"12.{driver}"
        drv = int(driver.split(".")[0])
        # What this fake "driver" reports: the table's profiles that exist on this driver.
        self._profiles: list[Profile] = [p for p in self._model.profiles
                                         if p.min_driver is None or drv >= p.min_driver]
        pending = int(mig_enabled if pending_mig is None else pending_mig)
        self._gpus = [_Gpu(i, self._model, int(mig_enabled), f"GPU-{uuid.uuid4()}",
                           pending_mig=pending) for i in range(count)]
        self._addr = itertools.count(0x1000, 0x10)
        self._handles: dict[int, Any] = {}
        self._faults: list[tuple[str, int]] = []
        self.calls: list[str] = []
        self.initialised = False

    # ---- test hooks ---------------------------------------------------------------------

    def fail_next(self, fn_name: str, error: int) -> None:
        """Make the next call of ``fn_name`` raise ``NVMLError(error)``."""
        self._faults.append((fn_name, error))

    def add_process(self, gpu: int, start: int, pid: int) -> None:
        """Pretend ``pid`` runs on the compute instance of the GI placed at ``start``."""
        gi = next(g for g in self._gpus[gpu].gis.values() if g.start == start)
        next(iter(gi.cis.values())).pids.append(pid)

    def report_profile(self, profile: str, /, **changes: Any) -> None:
        """Report ``profile`` with some fields changed (``sm_count=..., starts=...``)."""
        i = next(i for i, p in enumerate(self._profiles) if p.name == profile)
        self._profiles[i] = replace(self._profiles[i], **changes)

    def hide_profile(self, profile: str) -> None:
        """Stop reporting ``profile`` (as a driver without it would)."""
        self._profiles = [p for p in self._profiles if p.name != profile]

    def clear_processes(self) -> None:
        for g in self._gpus:
            for gi in g.gis.values():
                for ci in gi.cis.values():
                    ci.pids.clear()

    # ---- internals ----------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if name != "nvmlInit" and not self.initialised:
            raise _p.NVMLError(_p.NVML_ERROR_UNINITIALIZED)
        for i, (fn, err) in enumerate(self._faults):
            if fn == name:
                del self._faults[i]
                raise _p.NVMLError(err)

    def _new_handle(self, ptype: Any, obj: Any) -> Any:
        addr = next(self._addr)
        self._handles[addr] = obj
        return ctypes.cast(ctypes.c_void_p(addr), ptype)

    def _obj(self, handle: Any) -> Any:
        addr = ctypes.cast(handle, ctypes.c_void_p).value
        try:
            return self._handles[addr]
        except KeyError:
            raise _p.NVMLError(_p.NVML_ERROR_INVALID_ARGUMENT) from None

    def _profile_by_id(self, pid: int) -> Any:
        for p in self._profiles:
            if p.profile_id == pid:
                return p
        raise _p.NVMLError(_p.NVML_ERROR_INVALID_ARGUMENT)

    # ---- system / device ----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if not self._driver_loaded:
            raise _p.NVMLError(_p.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self._driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return self._nvml_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Gpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(self._gpus):
            raise _p.NVMLError(_p.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpus[i]

    def nvmlDeviceGetPciInfo(self, h: _Gpu) -> Any:
        self._enter("nvmlDeviceGetPciInfo")
        ids = h.model.pci_device_ids
        dev = int(ids[0], 16) if ids else 0xFFFF  # models the tables know by name only
        return SimpleNamespace(pciDeviceId=(dev << 16) | 0x10DE)

    def nvmlDeviceGetName(self, h: _Gpu) -> str:
        self._enter("nvmlDeviceGetName")
        if h.model.device_names:
            return "NVIDIA " + h.model.device_names[0]
        return h.model.full_name

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        self._enter("nvmlDeviceGetUUID")
        return h.ci.uuid if isinstance(h, _Mig) else h.uuid

    def nvmlDeviceGetMigMode(self, h: _Gpu) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        return [h.mig_mode, h.pending_mig]

    # ---- GPU instances ------------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: _Gpu, index: int, version: int = 2) -> Any:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo")
        for p in self._profiles:
            if p.nvml_index == index:
                return SimpleNamespace(id=p.profile_id, sliceCount=p.compute_slices,
                                       instanceCount=p.max_count,
                                       multiprocessorCount=p.sm_count,
                                       memorySizeMB=int(p.memory_gib * 1024),
                                       name=f"MIG {p.name}".encode())
        raise _p.NVMLError(_p.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: _Gpu, pid: int, arr: Any,
                                                    count_ref: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstancePossiblePlacements")
        p = self._profile_by_id(pid)
        if arr is None:
            count_ref.contents.value = len(p.starts)
            return 0
        if count_ref.contents.value < len(p.starts):
            raise _p.NVMLError(_p.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, s in enumerate(p.starts):
            arr[i].start, arr[i].size = s, p.size
        count_ref.contents.value = len(p.starts)
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: _Gpu, pid: int,
                                                 placement_ref: Any) -> Any:
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement")
        if h.mig_mode != _p.NVML_DEVICE_MIG_ENABLE:
            raise _p.NVMLError(_p.NVML_ERROR_NOT_SUPPORTED)
        p = self._profile_by_id(pid)
        pl = placement_ref.contents
        if pl.start not in p.starts or pl.size != p.size:
            raise _p.NVMLError(_p.NVML_ERROR_INVALID_ARGUMENT)
        mine = set(range(pl.start, pl.start + p.size))
        for gi in h.gis.values():
            if mine & set(range(gi.start, gi.start + gi.size)):
                raise _p.NVMLError(_p.NVML_ERROR_INSUFFICIENT_RESOURCES)
        if sum(gi.profile_id == pid for gi in h.gis.values()) >= p.max_count:
            raise _p.NVMLError(_p.NVML_ERROR_INSUFFICIENT_RESOURCES)
        drv = int(self._driver.split(".")[0])
        if h.model.legacy_4g3g_ban and drv < 510:
            gs = {gi.slices for gi in h.gis.values()}
            if p.compute_slices in (3, 4) and ({3, 4} - {p.compute_slices}) & gs:
                raise _p.NVMLError(_p.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = _Gi(h.next_gi, pid, pl.start, p.size, p.compute_slices)
        h.next_gi += 1
        gi.handle = self._new_handle(_p.c_nvmlGpuInstance_t, (h, gi))
        h.gis[gi.id] = gi
        return gi.handle

    def nvmlDeviceGetGpuInstances(self, h: _Gpu, pid: int, arr: Any, count_ref: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstances")
        self._profile_by_id(pid)
        mine = [gi for gi in h.gis.values() if gi.profile_id == pid]
        for i, gi in enumerate(mine):
            arr[i] = gi.handle
        count_ref.contents.value = len(mine)
        return 0

    def nvmlGpuInstanceGetInfo(self, gih: Any) -> Any:
        self._enter("nvmlGpuInstanceGetInfo")
        _h, gi = self._obj(gih)
        return SimpleNamespace(id=gi.id, profileId=gi.profile_id,
                               placement=SimpleNamespace(start=gi.start, size=gi.size))

    def nvmlGpuInstanceDestroy(self, gih: Any) -> int:
        self._enter("nvmlGpuInstanceDestroy")
        h, gi = self._obj(gih)
        if gi.id not in h.gis:
            raise _p.NVMLError(_p.NVML_ERROR_INVALID_ARGUMENT)
        if gi.cis:
            raise _p.NVMLError(_p.NVML_ERROR_IN_USE)
        del h.gis[gi.id]
        return 0

    # ---- compute instances --------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gih: Any, index: int, eng: int,
                                                     version: int = 2) -> Any:
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
        _h, gi = self._obj(gih)
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}.get(index)
        if slices is None or slices > gi.slices:
            raise _p.NVMLError(_p.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=index, sliceCount=slices, instanceCount=gi.slices // slices)

    def nvmlGpuInstanceCreateComputeInstance(self, gih: Any, ci_pid: int) -> Any:
        self._enter("nvmlGpuInstanceCreateComputeInstance")
        h, gi = self._obj(gih)
        if gi.cis:
            raise _p.NVMLError(_p.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci = _Ci(len(gi.cis), ci_pid, gi, f"MIG-{uuid.uuid4()}")
        ci.handle = self._new_handle(_p.c_nvmlComputeInstance_t, (h, ci))
        gi.cis[ci.id] = ci
        return ci.handle

    def nvmlGpuInstanceGetComputeInstances(self, gih: Any, ci_pid: int, arr: Any,
                                           count_ref: Any) -> int:
        self._enter("nvmlGpuInstanceGetComputeInstances")
        _h, gi = self._obj(gih)
        mine = [ci for ci in gi.cis.values() if ci.profile_id == ci_pid]
        for i, ci in enumerate(mine):
            arr[i] = ci.handle
        count_ref.contents.value = len(mine)
        return 0

    def nvmlComputeInstanceDestroy(self, cih: Any) -> int:
        self._enter("nvmlComputeInstanceDestroy")
        _h, ci = self._obj(cih)
        if ci.pids:
            raise _p.NVMLError(_p.NVML_ERROR_IN_USE)
        ci.gi.cis.pop(ci.id, None)
        return 0

    # ---- MIG device handles -------------------------------------------------------------

    def _migs(self, h: _Gpu) -> list[_Mig]:
        return [_Mig(h, ci) for gi in sorted(h.gis.values(), key=lambda g: g.start)
                for ci in gi.cis.values()]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Gpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        return h.model.max_instances

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Gpu, i: int) -> _Mig:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        migs = self._migs(h)
        if i >= len(migs):
            raise _p.NVMLError(_p.NVML_ERROR_NOT_FOUND)
        return migs[i]

    def nvmlDeviceGetGpuInstanceId(self, mig: _Mig) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        return mig.ci.gi.id

    def nvmlDeviceGetComputeInstanceId(self, mig: _Mig) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        return mig.ci.id

    def nvmlDeviceGetComputeRunningProcesses(self, mig: _Mig) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in mig.ci.pids]
