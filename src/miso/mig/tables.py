"""MIG hardware tables: GPU models, their GPU-instance profiles and allowed placements.

This is data, kept in one readable literal. Every row comes from NVIDIA's MIG user guide
(supported-mig-profiles), real ``nvidia-smi mig -lgip`` / ``-lgipp`` captures and the NVML header,
as listed in ``docs/hardware.md``. Rows marked
``inferred`` in a model's ``notes`` were derived from identical documented fractions and counts,
without a ``-lgipp`` capture of that exact GPU.

Units: ``memory_gib`` is the "Memory GiB" column of ``-lgip``; ``size`` and ``starts`` are in
*placement units* (the index of the first occupied memory slice, as NVML reports it). The unit
count is a property of the GPU model: 8 on A100/H100/H200/B200, 4 on A30, 12 on RTX PRO 6000.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# NVML profile *indexes* (NVML_GPU_INSTANCE_PROFILE_*), passed to
# nvmlDeviceGetGpuInstanceProfileInfo. Not to be confused with the profile *IDs* below.
NVML_1_SLICE = 0
NVML_2_SLICE = 1
NVML_3_SLICE = 2
NVML_4_SLICE = 3
NVML_7_SLICE = 4
NVML_8_SLICE = 5
NVML_6_SLICE = 6
NVML_1_SLICE_REV1 = 7  # +me (media extensions)
NVML_2_SLICE_REV1 = 8  # +me
NVML_1_SLICE_REV2 = 9  # twice the memory of the plain 1-slice profile


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile of one GPU model.

    ``profile_id`` is the per-device ID that nvidia-smi prints and NVML's placement/create calls
    take; IDs are *not* global across models. ``default`` marks the profiles the scheduler uses
    unless told otherwise: one profile per compute-slice count, no media-extension variants.
    """

    name: str
    profile_id: int
    nvml_index: int | None
    compute_slices: int
    sm_count: int
    memory_gib: float
    size: int
    starts: tuple[int, ...]
    max_count: int
    default: bool = True
    media_extension: bool = False
    min_driver: int | None = None


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model: its placement units, compute slices and profiles."""

    name: str
    full_name: str
    pci_device_ids: tuple[str, ...]
    units: int
    compute_slices: int
    max_instances: int
    profiles: tuple[Profile, ...]
    aliases: tuple[str, ...] = ()
    notes: str = ""
    #: Pre-R510 drivers refuse 4g+3g together on A100-class GPUs (a driver rule, not geometry).
    legacy_4g3g_ban: bool = False
    _by_name: dict[str, Profile] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for p in self.profiles:
            self._by_name[p.name] = p
            if p.size > self.units or any(s + p.size > self.units for s in p.starts):
                raise ValueError(f"{self.name}: profile {p.name} placed beyond {self.units} units")

    def profile(self, name: str) -> Profile:
        """The profile called ``name`` (e.g. ``"3g.20gb"``), with a clear error if unknown."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(p.name for p in self.profiles)
            raise KeyError(f"GPU {self.name} has no MIG profile {name!r}; known: {known}") from None

    def default_profiles(self) -> tuple[Profile, ...]:
        """Profiles the scheduler uses by default, largest first."""
        return tuple(
            sorted((p for p in self.profiles if p.default), key=lambda p: -p.compute_slices)
        )

    def full_profile(self) -> Profile:
        """The profile that spans the whole GPU (7g on most models, 4g on A30 and RTX PRO)."""
        return max(self.default_profiles(), key=lambda p: (p.compute_slices, p.size))


def _p(
    name: str, pid: int, idx: int | None, g: int, sm: int, mem: float, size: int,
    starts: tuple[int, ...], count: int, *, default: bool = True, me: bool = False,
    min_driver: int | None = None,
) -> Profile:
    return Profile(name, pid, idx, g, sm, mem, size, starts, count, default, me, min_driver)


_ALL7 = (0, 1, 2, 3, 4, 5, 6)


def _hopper_like(
    prefix_mem: tuple[str, str, str, str, str],
    gib: tuple[float, float, float, float],
    sms: tuple[int, int, int, int, int, int],
) -> tuple[Profile, ...]:
    """Profiles of the 8-unit Hopper/Blackwell family, which share IDs and placements.

    ``prefix_mem`` names (1g, 1g-double, 2g, 3g/4g, 7g) memory suffixes; ``gib`` gives memory of
    1g, 1g-double/2g, 3g/4g, 7g; ``sms`` the SM counts of 1g, 1g-double, 2g, 3g, 4g, 7g.
    """
    m1, m1d, m3, m7 = gib
    s1, s1d, s2, s3, s4, s7 = sms
    n1, n1d, n3, n7 = prefix_mem[0], prefix_mem[1], prefix_mem[3], prefix_mem[4]
    return (
        _p(f"1g.{n1}", 19, NVML_1_SLICE, 1, s1, m1, 1, _ALL7, 7),
        _p(f"1g.{n1}+me", 20, NVML_1_SLICE_REV1, 1, s1, m1, 1, _ALL7, 1, default=False, me=True),
        _p(f"1g.{n1d}", 15, NVML_1_SLICE_REV2, 1, s1d, m1d, 2, (0, 2, 4, 6), 4, default=False),
        _p(f"2g.{n1d}", 14, NVML_2_SLICE, 2, s2, m1d, 2, (0, 2, 4), 3),
        _p(f"3g.{n3}", 9, NVML_3_SLICE, 3, s3, m3, 4, (0, 4), 2),
        _p(f"4g.{n3}", 5, NVML_4_SLICE, 4, s4, m3, 4, (0,), 1),
        _p(f"7g.{n7}", 0, NVML_7_SLICE, 7, s7, m7, 8, (0,), 1),
    )


def _a100(mem: tuple[str, str, str, str], gib: tuple[float, float, float, float],
          min_double: int) -> tuple[Profile, ...]:
    n1, n2, n3, n7 = mem
    m1, m2, m3, m7 = gib
    return (
        _p(f"1g.{n1}", 19, NVML_1_SLICE, 1, 14, m1, 1, _ALL7, 7),
        _p(f"1g.{n1}+me", 20, NVML_1_SLICE_REV1, 1, 14, m1, 1, _ALL7, 1, default=False, me=True),
        _p(f"1g.{n2}", 15, NVML_1_SLICE_REV2, 1, 14, m2, 2, (0, 2, 4, 6), 4, default=False,
           min_driver=min_double),
        _p(f"2g.{n2}", 14, NVML_2_SLICE, 2, 28, m2, 2, (0, 2, 4), 3),
        _p(f"3g.{n3}", 9, NVML_3_SLICE, 3, 42, m3, 4, (0, 4), 2),
        _p(f"4g.{n3}", 5, NVML_4_SLICE, 4, 56, m3, 4, (0,), 1),
        _p(f"7g.{n7}", 0, NVML_7_SLICE, 7, 98, m7, 8, (0,), 1),
    )


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel(
            "A100-40GB", "NVIDIA A100-SXM4-40GB / A100-PCIE-40GB", ("0x20B0", "0x20F1"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_a100(("5gb", "10gb", "20gb", "40gb"), (4.75, 9.62, 19.50, 39.25), 525),
            aliases=("A100-SXM4-40GB", "A100-PCIE-40GB", "A100"),
            notes="-lgip/-lgipp from the MIG user guide; 1g.10gb needs R525+.",
            legacy_4g3g_ban=True,
        ),
        GpuModel(
            "A100-80GB", "NVIDIA A100-SXM4-80GB / A100-PCIE-80GB", ("0x20B2", "0x20B5"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_a100(("10gb", "20gb", "40gb", "80gb"), (9.50, 19.50, 39.25, 79.25), 525),
            aliases=("A100-SXM4-80GB", "A100-PCIE-80GB"),
            notes="Same IDs and placements as A100-40GB (user guide); GiB from mig-parted #97.",
            legacy_4g3g_ban=True,
        ),
        GpuModel(
            "A30-24GB", "NVIDIA A30", ("0x20B7",),
            units=4, compute_slices=4, max_instances=4,
            profiles=(
                _p("1g.6gb", 14, NVML_1_SLICE, 1, 14, 5.81, 1, (0, 1, 2, 3), 4),
                _p("1g.6gb+me", 21, NVML_1_SLICE_REV1, 1, 14, 5.81, 1, (0, 1, 2, 3), 1,
                   default=False, me=True),
                _p("2g.12gb", 5, NVML_2_SLICE, 2, 28, 11.69, 2, (0, 2), 2),
                _p("2g.12gb+me", 6, NVML_2_SLICE_REV1, 2, 28, 11.69, 2, (0, 2), 1,
                   default=False, me=True, min_driver=525),
                _p("4g.24gb", 0, NVML_4_SLICE, 4, 56, 23.44, 4, (0,), 1),
            ),
            aliases=("A30",),
            notes="-lgip/-lgipp capture on driver 535.183.01; 4 placement units.",
        ),
        GpuModel(
            "H100-80GB", "NVIDIA H100 80GB HBM3 (SXM5)", ("0x2330",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_hopper_like(("10gb", "20gb", "20gb", "40gb", "80gb"),
                                  (9.75, 19.62, 39.50, 79.25), (16, 26, 32, 60, 64, 132)),
            aliases=("H100-SXM5-80GB", "H100"),
            notes="SXM5 -lgip/-lgipp capture.",
        ),
        GpuModel(
            "H100-PCIE-80GB", "NVIDIA H100 PCIe 80GB", ("0x2331",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_hopper_like(("10gb", "20gb", "20gb", "40gb", "80gb"),
                                  (9.75, 19.62, 39.50, 79.25), (14, 14, 30, 46, 62, 114)),
            notes="PCIe -lgip on driver 570.169; placements as SXM5.",
        ),
        GpuModel(
            "H100-94GB", "NVIDIA H100 NVL 94GB", ("0x2321",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_hopper_like(("12gb", "24gb", "24gb", "47gb", "94gb"),
                                  (10.75, 21.62, 46.38, 93.12), (16, 26, 32, 60, 64, 132)),
            aliases=("H100-NVL",),
            notes="-lgip from gpu-operator #900/#903, -lgipp from an H100 NVL capture.",
        ),
        GpuModel(
            "H200-141GB", "NVIDIA H200 141GB (SXM / NVL)", ("0x2335", "0x233B"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_hopper_like(("18gb", "35gb", "35gb", "71gb", "141gb"),
                                  (16.00, 32.25, 69.50, 139.75), (16, 26, 32, 60, 64, 132)),
            aliases=("H200",),
            notes="-lgip from mig-parted #120; placements inferred (same fractions as H100).",
        ),
        GpuModel(
            "B200-180GB", "NVIDIA B200 180GB", ("0x2901",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_hopper_like(("23gb", "45gb", "45gb", "90gb", "180gb"),
                                  (20.50, 44.25, 89.00, 178.50), (18, 30, 36, 70, 72, 148)),
            aliases=("B200",),
            notes="gpu-operator #1242/#1351 (1g.23gb 20.50 GiB on the Mar-2025 driver); "
                  "3g/4g/7g from a third-party -lgip; placements inferred.",
        ),
        GpuModel(
            "RTX-PRO-6000", "NVIDIA RTX PRO 6000 Blackwell (Server / Workstation / Max-Q)",
            ("0x2BB5",),
            units=12, compute_slices=4, max_instances=4,
            profiles=(
                _p("1g.24gb", 14, NVML_1_SLICE, 1, 46, 23.62, 3, (0, 3, 6, 9), 4),
                _p("1g.24gb+me", 21, NVML_1_SLICE_REV1, 1, 46, 23.62, 3, (0, 3, 6, 9), 1,
                   default=False, me=True),
                _p("2g.48gb", 5, NVML_2_SLICE, 2, 94, 47.38, 6, (0, 6), 2),
                _p("4g.96gb", 0, NVML_4_SLICE, 4, 188, 95.00, 12, (0,), 1),
            ),
            aliases=("RTX-PRO-6000-BLACKWELL", "RTXPRO6000"),
            notes="-lgip driver 580.105.08 and -lgipp capture; 12 placement units. "
                  "+gfx/-me/+me.all variants are not modelled.",
        ),
    )
}


def _norm(name: str) -> str:
    return name.upper().replace("_", "-").replace(" ", "-")


def gpu_model(name: str) -> GpuModel:
    """Look up a GPU model by name or alias (case-insensitive), with a clear error."""
    key = _norm(name)
    for m in GPU_MODELS.values():
        if key == _norm(m.name) or key in (_norm(a) for a in m.aliases):
            return m
    raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(GPU_MODELS)}")
