"""``miso doctor``: a read-only check of this machine's NVIDIA GPUs against miso's MIG tables.

It reads, and never changes, through NVML: the driver and NVML versions, each GPU's name and PCI
device id, its MIG mode (current and pending), and every GPU-instance profile NVML reports
(``nvmlDeviceGetGpuInstanceProfileInfo`` over all profile indexes) with its possible placements
(``nvmlDeviceGetGpuInstancePossiblePlacements``). Each profile is compared field by field with
the table entry of the same NVML profile index in :mod:`miso.mig.tables`. It also says whether
``nvidia-cuda-mps-control`` is on the PATH and whether this process may reconfigure MIG (root, or
read access to the driver's ``mig/config`` capability device).

No call here sets anything: no MIG mode, no compute mode, no instance create/destroy, no reset.
:func:`collect` reads (the pynvml module is injected, so tests run it on
:class:`tests/fakenvml.py.FakeNvml`); :func:`compare_profiles` is pure; :func:`doctor` is the
command (exit 0 all match, 1 mismatches, 2 no NVIDIA driver).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # the MIG tables are read when the command runs (``--help`` stays fast)
    from miso.mig.gpumodel import GpuModel, Profile

#: Largest difference between NVML's memorySizeMB (in GiB) and the table's GiB that still matches.
MEMORY_TOLERANCE_GIB = 0.02
MPS_CONTROL = "nvidia-cuda-mps-control"
#: The NVIDIA driver's MIG-management capability (see the MIG user guide, "Device Nodes and
#: Capabilities"): the minor number of /dev/nvidia-caps/nvidia-cap<N> is read from this file.
MIG_CONFIG_CAP = "proc/driver/nvidia/capabilities/mig/config"


class NoDriver(Exception):
    """NVML cannot be used here: no NVIDIA driver (or no NVML library)."""


@dataclass(frozen=True)
class ReportedProfile:
    """One GPU-instance profile as NVML reports it."""

    nvml_index: int
    name: str
    profile_id: int
    compute_slices: int
    max_count: int
    sm_count: int
    memory_mib: int
    size: int | None
    starts: tuple[int, ...]


@dataclass
class GpuReport:
    index: int
    name: str
    pci_device_id: str
    model: str | None
    mig_supported: bool
    mig_current: bool | None
    mig_pending: bool | None
    profiles: list[ReportedProfile] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    driver_version: str
    nvml_version: str
    mps_control: str | None
    can_reconfigure: bool
    reconfigure_reason: str
    gpus: list[GpuReport] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return sum(len(g.mismatches) for g in self.gpus)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.mismatches == 0
        return out


# ---- pure comparison ------------------------------------------------------------------------


def _clean_name(name: str) -> str:
    return name.removeprefix("MIG ").strip()


def _field_note(p: Profile, what: str) -> str:
    return " (inferred in the table)" if what in p.inferred else ""


def compare_profiles(model: GpuModel, reported: list[ReportedProfile],
                     driver_major: int | None) -> tuple[list[str], list[str]]:
    """(mismatches, notes) between NVML's profiles and ``model``'s table, by NVML index."""
    mism: list[str] = []
    notes: list[str] = []
    table = {p.nvml_index: p for p in model.profiles if p.nvml_index is not None}
    seen = set()
    for r in sorted(reported, key=lambda r: r.nvml_index):
        p = table.get(r.nvml_index)
        if p is None:
            mism.append(f"NVML reports profile {r.name} (index {r.nvml_index}, id "
                        f"{r.profile_id}) that miso's {model.name} table lacks")
            continue
        seen.add(r.nvml_index)
        pairs: list[tuple[str, str, object, object]] = [
            ("name", "name", r.name, p.name),
            ("profile id", "profile_id", r.profile_id, p.profile_id),
            ("compute slices", "", r.compute_slices, p.compute_slices),
            ("instance count", "max_count", r.max_count, p.max_count),
            ("SM count", "sm_count", r.sm_count, p.sm_count),
        ]
        for label, key, got, want in pairs:
            if got != want:
                mism.append(f"{p.name}: {label} is {got} on NVML, {want} in the table"
                            f"{_field_note(p, key)}")
        gib = r.memory_mib / 1024
        if abs(gib - p.memory_gib) > MEMORY_TOLERANCE_GIB:
            mism.append(f"{p.name}: memory is {gib:.2f} GiB on NVML, {p.memory_gib:.2f} GiB in "
                        f"the table{_field_note(p, 'memory_gib')}")
        if r.size is not None and (r.size, r.starts) != (p.size, p.starts):
            got_pl = "{" + ",".join(map(str, r.starts)) + f"}}:{r.size}"
            want_pl = "{" + ",".join(map(str, p.starts)) + f"}}:{p.size}"
            mism.append(f"{p.name}: placements are {got_pl} on NVML, {want_pl} in the table"
                        f"{_field_note(p, 'placements')}")
    for idx, p in sorted(table.items()):
        if idx in seen:
            continue
        if p.min_driver is not None and driver_major is not None and driver_major < p.min_driver:
            notes.append(f"{p.name} is not reported; it needs driver R{p.min_driver}+ "
                         f"(running R{driver_major})")
        else:
            mism.append(f"the table has {p.name} (index {idx}, id {p.profile_id}) but NVML does "
                        f"not report it")
    return mism, notes


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for x in v.split("."):
        if not x.isdigit():
            break
        parts.append(int(x))
    return tuple(parts)


def driver_notes(model: GpuModel, driver: str) -> list[str]:
    """A note when ``driver`` is older than the MIG user guide's minimum for ``model``."""
    if model.min_driver and _version_tuple(driver) < _version_tuple(model.min_driver):
        return [f"driver {driver} is older than the MIG user guide's minimum "
                f"{model.min_driver} for {model.name}"]
    return []


# ---- reading (NVML, filesystem) -------------------------------------------------------------


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _placements(n: Any, h: Any, pid: int) -> tuple[int | None, tuple[int, ...]]:
    count = ctypes.c_uint(0)
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, pid, None, ctypes.pointer(count))
    arr = (n.c_nvmlGpuInstancePlacement_t * count.value)()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, pid, arr, ctypes.pointer(count))
    got = arr[: count.value]
    sizes = {int(x.size) for x in got}
    size = sizes.pop() if len(sizes) == 1 else None
    return size, tuple(sorted(int(x.start) for x in got))


def _profiles(n: Any, h: Any) -> list[ReportedProfile]:
    out = []
    for idx in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, idx)
        except n.NVMLError:
            continue  # not supported on this device / driver
        pid = int(info.id)
        try:
            size, starts = _placements(n, h, pid)
        except n.NVMLError:
            size, starts = None, ()
        out.append(ReportedProfile(idx, _clean_name(_text(info.name)), pid,
                                   int(info.sliceCount), int(info.instanceCount),
                                   int(info.multiprocessorCount), int(info.memorySizeMB),
                                   size, starts))
    return out


def _gpu(n: Any, i: int, driver: str) -> GpuReport:
    h = n.nvmlDeviceGetHandleByIndex(i)
    name = _text(n.nvmlDeviceGetName(h))
    dev_id = int(n.nvmlDeviceGetPciInfo(h).pciDeviceId) >> 16
    from miso.mig.tables import model_for_name, model_for_pci

    model = model_for_pci(dev_id) or model_for_name(name)
    try:
        cur, pend = n.nvmlDeviceGetMigMode(h)
    except n.NVMLError:
        return GpuReport(i, name, f"0x{dev_id:04X}", model.name if model else None, False, None,
                         None, notes=["MIG is not supported on this GPU (NVML)"])
    on = n.NVML_DEVICE_MIG_ENABLE
    g = GpuReport(i, name, f"0x{dev_id:04X}", model.name if model else None, True,
                  int(cur) == on, int(pend) == on, profiles=_profiles(n, h))
    if g.mig_current != g.mig_pending:
        g.notes.append("a MIG mode change is pending (takes effect after a GPU reset)")
    if model is None:
        if g.profiles:
            g.mismatches.append(f"{name} (PCI 0x{dev_id:04X}) reports MIG profiles but is not "
                                f"in miso's tables")
        return g
    if not g.profiles:
        g.notes.append("NVML lists no GPU-instance profiles (MIG mode off?); nothing compared")
        return g
    drv = _version_tuple(driver)
    g.mismatches, notes = compare_profiles(model, g.profiles, drv[0] if drv else None)
    g.notes += notes + driver_notes(model, driver)
    return g


def reconfigure_permission(root: Path = Path("/"),
                           euid: Callable[[], int] = os.geteuid) -> tuple[bool, str]:
    """Whether this process may create/destroy MIG instances, and why (nothing is tried)."""
    if euid() == 0:
        return True, "running as root"
    cap = root / MIG_CONFIG_CAP
    try:
        text = cap.read_text()
    except OSError:
        return False, f"not root, and /{MIG_CONFIG_CAP} is not readable"
    minor = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("DeviceFileMinor")), None)
    if minor is None:
        return False, f"not root, and /{MIG_CONFIG_CAP} names no device minor"
    dev = root / "dev" / "nvidia-caps" / f"nvidia-cap{minor}"
    if os.access(dev, os.R_OK):
        return True, f"not root, but may read the mig/config capability /{dev.relative_to(root)}"
    return False, f"not root, and /{dev.relative_to(root)} (mig/config capability) is not readable"


def collect(n: Any, *, which: Callable[[str], str | None] = shutil.which,
            permission: Callable[[], tuple[bool, str]] = reconfigure_permission) -> Report:
    """Read everything the report needs; raises :class:`NoDriver` when NVML cannot start."""
    try:
        n.nvmlInit()
    except n.NVMLError as e:
        raise NoDriver(f"no NVIDIA driver: NVML could not start ({e})") from None
    try:
        driver = _text(n.nvmlSystemGetDriverVersion())
        try:
            nvml_version = _text(n.nvmlSystemGetNVMLVersion())
        except n.NVMLError:
            nvml_version = "unknown"
        allowed, reason = permission()
        rep = Report(driver, nvml_version, which(MPS_CONTROL), allowed, reason)
        for i in range(int(n.nvmlDeviceGetCount())):
            try:
                rep.gpus.append(_gpu(n, i, driver))
            except n.NVMLError as e:  # report it and go on with the other GPUs
                rep.gpus.append(GpuReport(i, "unknown", "unknown", None, False, None, None,
                                          mismatches=[f"NVML failed while reading GPU {i}: {e}"]))
        return rep
    finally:
        with contextlib.suppress(n.NVMLError):
            n.nvmlShutdown()


# ---- the command ----------------------------------------------------------------------------


def _render(rep: Report) -> str:
    lines = [f"driver {rep.driver_version}, NVML {rep.nvml_version}",
             f"{MPS_CONTROL}: {rep.mps_control or 'not found'}",
             f"may reconfigure MIG: {'yes' if rep.can_reconfigure else 'no'} "
             f"({rep.reconfigure_reason})"]
    if not rep.gpus:
        lines.append("no GPUs")
    for g in rep.gpus:
        mode = ("MIG not supported" if not g.mig_supported else
                f"MIG {'on' if g.mig_current else 'off'} "
                f"(pending {'on' if g.mig_pending else 'off'})")
        lines.append(f"GPU {g.index}: {g.name} (PCI {g.pci_device_id}), table "
                     f"{g.model or 'none'}, {mode}")
        for p in g.profiles:
            pl = "{" + ",".join(map(str, p.starts)) + f"}}:{p.size}"
            lines.append(f"  {p.name:16} idx {p.nvml_index:2} id {p.profile_id:2} "
                         f"x{p.max_count} SM {p.sm_count:3} {p.memory_mib / 1024:7.2f} GiB {pl}")
        lines += [f"  mismatch: {m}" for m in g.mismatches]
        lines += [f"  note: {m}" for m in g.notes]
    n = rep.mismatches
    lines.append("all profiles match miso's tables" if n == 0 else
                 f"{n} mismatch{'es' if n != 1 else ''} with miso's tables")
    return "\n".join(lines)


def run(n: Any, json_out: bool) -> int:
    """Print the report of NVML module ``n``; returns the exit code (0, 1 or 2)."""
    try:
        rep = collect(n)
    except NoDriver as e:
        typer.echo(f"error: {e}", err=True)
        return 2
    typer.echo(json.dumps(rep.to_json(), indent=2) if json_out else _render(rep))
    return 0 if rep.mismatches == 0 else 1


def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Read-only check of this machine's NVIDIA GPUs against miso's MIG tables (changes nothing)."""
    try:
        import pynvml  # noqa: PLC0415 - only when the command runs
    except ImportError:
        typer.echo("error: no NVIDIA driver: the NVML bindings (nvidia-ml-py) are missing",
                   err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(run(pynvml, json_out))
