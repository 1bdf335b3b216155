"""Emulated MIG GPUs: the same interface as NVML, driven by the hardware tables.

The emulator tracks which placement units are occupied and refuses what NVML refuses:

* creating an instance that overlaps another (``INSUFFICIENT_RESOURCES``), at a start the table
  does not allow (``INVALID_ARGUMENT``), beyond the profile's instance count
  (``INSUFFICIENT_RESOURCES``) or on a GPU whose MIG mode is off (``NOT_SUPPORTED``);
* destroying an instance a live process still uses (``IN_USE``). A process "uses" a fake MIG
  device when its environment holds ``CUDA_VISIBLE_DEVICES=<that MIG- UUID>`` (read from
  ``/proc/<pid>/environ``), which is how a real CUDA process would bind to it.

Processes learn the slice behind a fake UUID from ``MISO_EMULATED_PROFILE`` /
``MISO_EMULATED_GPU_MODEL`` (set by :meth:`EmulatedBackend.job_env`), which is what the reference
workload (:mod:`miso.emuworkload`) reads to pick its speed from the A100 table.

Faults can be injected with :meth:`EmulatedBackend.fail_next`.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from pathlib import Path

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
from miso.mig import Geometry, Placement, geometry, gpu_model

_KINDS: dict[str, type[BackendError]] = {
    "IN_USE": InstanceInUse,
    "INSUFFICIENT_RESOURCES": InsufficientResources,
    "NOT_SUPPORTED": NotSupported,
    "INVALID_ARGUMENT": InvalidPlacement,
    "NOT_FOUND": NotFound,
}


def pids_with_env(name: str, value: str) -> list[int]:
    """PIDs of live processes (of this user) whose initial environment has ``name=value``."""
    needle = f"{name}={value}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue  # gone, zombie or not ours
        if needle in env.split(b"\0"):
            out.append(int(entry.name))
    return out


class EmulatedBackend(GpuBackend):
    """``count`` emulated GPUs of ``model`` with MIG on (no instances) unless told otherwise."""

    name = "emulated"

    def __init__(
        self,
        count: int = 1,
        model: str = "A100-40GB",
        *,
        node: str = "node",
        driver: int | None = None,
        mig_disabled: tuple[int, ...] = (),
        check_processes: bool = True,
    ) -> None:
        self._model = gpu_model(model)
        self._geom = geometry(self._model, driver=driver)
        self._node = node
        self._gpus = [
            GpuInfo(i, f"GPU-{uuid.uuid4()}", self._model.name, i not in mig_disabled)
            for i in range(count)
        ]
        self._devices: list[dict[Placement, MigDevice]] = [{} for _ in range(count)]
        self._next_gi = [1] * count
        self._faults: list[tuple[str, int | None, str]] = []
        self._check_processes = check_processes
        self._lock = threading.RLock()
        #: Every layout the GPU held after each create/destroy (for tests and audits).
        self.history: list[tuple[int, tuple[Placement, ...]]] = []

    # ---- fault injection ----------------------------------------------------------------

    def fail_next(self, op: str, kind: str = "UNKNOWN", *, gpu: int | None = None,
                  times: int = 1) -> None:
        """Make the next ``times`` calls of ``op`` (``create``/``destroy``) fail with ``kind``."""
        if op not in ("create", "destroy"):
            raise ValueError(f"can only inject faults into create/destroy, not {op!r}")
        with self._lock:
            self._faults.extend([(op, gpu, kind)] * times)

    def _maybe_fail(self, op: str, gpu: int, what: str) -> None:
        for i, (fop, fgpu, kind) in enumerate(self._faults):
            if fop == op and (fgpu is None or fgpu == gpu):
                del self._faults[i]
                cls = _KINDS.get(kind, BackendError)
                raise cls(f"GPU {gpu}: injected {kind} while trying to {op} {what}", kind=kind)

    # ---- interface ----------------------------------------------------------------------

    def _check_gpu(self, gpu: int) -> None:
        if not 0 <= gpu < len(self._gpus):
            raise NotFound(f"{self._node}: no GPU {gpu} (have {len(self._gpus)})")

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def geometry(self, gpu: int) -> Geometry:
        self._check_gpu(gpu)
        return self._geom

    def possible_placements(self, gpu: int) -> dict[str, tuple[int, ...]]:
        self._check_gpu(gpu)
        return {p.name: p.starts for p in self._model.profiles}

    def devices(self, gpu: int) -> dict[Placement, MigDevice]:
        self._check_gpu(gpu)
        with self._lock:
            return dict(self._devices[gpu])

    def create(self, gpu: int, placement: Placement) -> MigDevice:
        self._check_gpu(gpu)
        with self._lock:
            if not self._gpus[gpu].mig_enabled:
                raise NotSupported(f"GPU {gpu}: MIG mode is disabled; cannot create {placement}")
            try:
                prof = self._model.profile(placement.profile)
            except KeyError as e:
                raise NotSupported(f"GPU {gpu}: {e.args[0]}") from None
            if placement.start not in prof.starts:
                raise InvalidPlacement(
                    f"GPU {gpu}: {placement.profile} cannot start at {placement.start} "
                    f"(allowed {prof.starts})")
            self._maybe_fail("create", gpu, str(placement))
            sizes = {p.name: p.size for p in self._model.profiles}
            mine = set(range(placement.start, placement.start + prof.size))
            for other in self._devices[gpu]:
                theirs = set(range(other.start, other.start + sizes[other.profile]))
                if mine & theirs:
                    raise InsufficientResources(
                        f"GPU {gpu}: {placement} overlaps existing instance {other}")
            counts = Counter(p.profile for p in self._devices[gpu])
            if counts[placement.profile] >= prof.max_count or \
                    len(self._devices[gpu]) >= self._model.max_instances:
                raise InsufficientResources(f"GPU {gpu}: no capacity left for {placement.profile}")
            if self._geom.legacy_ban:
                gs = {self._model.profile(p.profile).compute_slices for p in self._devices[gpu]}
                if (prof.compute_slices == 4 and 3 in gs) or (prof.compute_slices == 3 and 4 in gs):
                    raise InsufficientResources(f"GPU {gpu}: driver refuses 4g with 3g")
            gi = self._next_gi[gpu]
            self._next_gi[gpu] += 1
            dev = MigDevice(gpu, placement, f"MIG-{uuid.uuid4()}", gi_id=gi, ci_id=0)
            self._devices[gpu][placement] = dev
            self.history.append((gpu, tuple(sorted(self._devices[gpu]))))
            return dev

    def destroy(self, gpu: int, placement: Placement) -> None:
        self._check_gpu(gpu)
        with self._lock:
            dev = self._devices[gpu].get(placement)
            if dev is None:
                raise NotFound(f"GPU {gpu}: no instance at {placement} to destroy")
            users = self.processes(gpu, placement)
            if users:
                raise InstanceInUse(
                    f"GPU {gpu}: cannot destroy {placement}: in use by pids {users}")
            self._maybe_fail("destroy", gpu, str(placement))
            del self._devices[gpu][placement]
            self.history.append((gpu, tuple(sorted(self._devices[gpu]))))

    def processes(self, gpu: int, placement: Placement) -> list[int]:
        dev = self.devices(gpu).get(placement)
        if dev is None or not self._check_processes:
            return []
        return pids_with_env("CUDA_VISIBLE_DEVICES", dev.uuid)

    def start_mps(self, gpu: int, placement: Placement, base_dir: str) -> MpsHandle:
        dev = self.devices(gpu).get(placement)
        if dev is None:
            raise NotFound(f"GPU {gpu}: no MIG device at {placement} for MPS")
        root = Path(base_dir) / f"mps-gpu{gpu}-{placement.profile}-{placement.start}"
        pipe, log = root / "pipe", root / "log"
        pipe.mkdir(parents=True, exist_ok=True)
        log.mkdir(parents=True, exist_ok=True)
        (log / "control.log").write_text(f"emulated MPS daemon for {dev.uuid}\n")
        return MpsHandle(gpu, placement, str(pipe), str(log))

    def stop_mps(self, handle: MpsHandle) -> None:
        return None

    def job_env(self, gpu: int, placement: Placement) -> dict[str, str]:
        env = super().job_env(gpu, placement)
        prof = self._model.profile(placement.profile)
        env.update({
            "MISO_EMULATED_PROFILE": placement.profile,
            "MISO_EMULATED_GPU_MODEL": self._model.name,
            "MISO_EMULATED_COMPUTE_SLICES": str(prof.compute_slices),
            "MISO_EMULATED_MEMORY_GIB": str(prof.memory_gib),
        })
        return env
