"""The MIG table rows: every GPU model's profiles and placements, each with its sources.

This is data, kept in one readable literal, every model with its sources next to it. The
sources are NVIDIA's MIG user guide (*Supported MIG profiles*, *Supported GPUs*, the r620
*Deployment considerations* driver table), NVIDIA/mig-parted's shipped configuration
(``deployments/systemd/config-default.yaml``: PCI device ids and profile groups), and public
``nvidia-smi mig -lgip`` / ``-lgipp`` captures (mostly in NVIDIA/mig-parted and
NVIDIA/gpu-operator pull requests); ``docs/hardware.md`` lists them in full.

Where a value was inferred rather than published, the profile's ``inferred`` field names it
(``placements``, ``sm_count``, ``memory_gib``, ``profile_id``, ...). Inferred memory is the
profile name's nominal size, an upper bound: the names overstate the real GiB.

Units: ``memory_gib`` is the "Memory GiB" column of ``-lgip``; ``size`` and ``starts`` are in
*placement units* (the index of the first occupied memory slice, as NVML reports it). The unit
count is a property of the GPU model: 8 on A100/H100/H200/B200/B300, 4 on A30, 12 on RTX PRO 6000.
Models that share a profile group (same names, IDs, counts and placements; mig-parted lists them
under one device filter) are one entry with several PCI device ids. The rows' shape is
:mod:`miso.mig.gpumodel`; the lookups (by name, alias, PCI id) are :mod:`miso.mig.tables`.
"""

from __future__ import annotations

from miso.mig.gpumodel import GpuModel, Profile

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
NVML_1_SLICE_GFX = 10  # +gfx (graphics APIs, GB20X)
NVML_2_SLICE_GFX = 11
NVML_4_SLICE_GFX = 12
NVML_1_SLICE_NO_ME = 13  # -me (no media engines)
NVML_2_SLICE_NO_ME = 14
NVML_1_SLICE_ALL_ME = 15  # +me.all (every media engine)
NVML_2_SLICE_ALL_ME = 16


def _p(
    name: str, pid: int, idx: int | None, g: int, sm: int, mem: float, size: int,
    starts: tuple[int, ...], count: int, *, default: bool = True, me: bool = False,
    min_driver: int | None = None, inferred: tuple[str, ...] = (),
) -> Profile:
    return Profile(name, pid, idx, g, sm, mem, size, starts, count, default, me, min_driver,
                   inferred)


_ALL7 = (0, 1, 2, 3, 4, 5, 6)
#: The 8-unit families' profile kinds, in table order: 1g, 1g+me, double-memory 1g, 2g, 3g, 4g, 7g.
_KINDS = ("1g", "1g+me", "1g2", "2g", "3g", "4g", "7g")
_PL = ("placements",)


def _eight_unit(
    names: tuple[str, str, str, str],
    gib: tuple[float, float, float, float],
    sms: tuple[int, int, int, int, int, int],
    *,
    min_double: int | None = None,
    min_me: int | None = None,
    common: tuple[str, ...] = (),
    inferred: dict[str, tuple[str, ...]] | None = None,
) -> tuple[Profile, ...]:
    """Profiles of the 8-unit A100/Hopper/Blackwell families, which share IDs and placements.

    ``names`` are the memory suffixes of 1g, double-memory 1g / 2g, 3g / 4g and 7g; ``gib`` the
    memory of the same four groups; ``sms`` the SM counts of 1g, double 1g, 2g, 3g, 4g, 7g.
    ``common`` is inferred for every profile, ``inferred`` adds per kind (see ``_KINDS``).
    """
    n1, n2, n3, n7 = names
    m1, m2, m3, m7 = gib
    s1, s1d, s2, s3, s4, s7 = sms
    extra = inferred or {}

    def inf(kind: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*common, *extra.get(kind, ()))))

    return (
        _p(f"1g.{n1}", 19, NVML_1_SLICE, 1, s1, m1, 1, _ALL7, 7, inferred=inf("1g")),
        _p(f"1g.{n1}+me", 20, NVML_1_SLICE_REV1, 1, s1, m1, 1, _ALL7, 1, default=False, me=True,
           min_driver=min_me, inferred=inf("1g+me")),
        _p(f"1g.{n2}", 15, NVML_1_SLICE_REV2, 1, s1d, m2, 2, (0, 2, 4, 6), 4, default=False,
           min_driver=min_double, inferred=inf("1g2")),
        _p(f"2g.{n2}", 14, NVML_2_SLICE, 2, s2, m2, 2, (0, 2, 4), 3, inferred=inf("2g")),
        _p(f"3g.{n3}", 9, NVML_3_SLICE, 3, s3, m3, 4, (0, 4), 2, inferred=inf("3g")),
        _p(f"4g.{n3}", 5, NVML_4_SLICE, 4, s4, m3, 4, (0,), 1, inferred=inf("4g")),
        _p(f"7g.{n7}", 0, NVML_7_SLICE, 7, s7, m7, 8, (0,), 1, inferred=inf("7g")),
    )


_A100_SMS = (14, 14, 28, 42, 56, 98)
_HOPPER_SMS = (16, 26, 32, 60, 64, 132)
_B200_SMS = (18, 30, 36, 70, 72, 148)
_NOMINAL = ("memory_gib",)  # memory is the name's nominal GB (no -lgip row seen)

# Source tags, expanded in docs/hardware.md.
UG_PROF = "MIG user guide, Supported MIG Profiles"
UG_GPUS = "MIG user guide, Supported GPUs"
UG_DRV = "MIG user guide r620, Deployment Considerations (minimum drivers)"
MIG_PARTED = "NVIDIA/mig-parted deployments/systemd/config-default.yaml"


def _rtx_pro(
    sfx: tuple[str, str], gib: tuple[float, float], sms: tuple[int, int], *, has_me: bool,
    inferred: tuple[str, ...],
) -> tuple[Profile, ...]:
    """RTX PRO 5000 / 4500 Blackwell: two compute slices, 1g (x2) and the full 2g.

    The guide publishes names, fractions and counts; NVML ids, SM counts and placement units are
    inferred from the RTX PRO 6000 and A30 pattern (half-GPU profile id 5, full 0) and
    ``inferred`` says so.
    """
    n1, n2 = sfx
    g1, g2 = gib
    s1, s2 = sms
    half, full = (0, 1), (0,)
    rows = [_p(f"1g.{n1}", 5, NVML_1_SLICE, 1, s1, g1, 1, half, 2, inferred=inferred)]
    if has_me:
        rows.append(_p(f"1g.{n1}+me", 6, NVML_1_SLICE_REV1, 1, s1, g1, 1, half, 1,
                       default=False, me=True, inferred=inferred))
    rows += [
        _p(f"1g.{n1}+gfx", 35, NVML_1_SLICE_GFX, 1, s1, g1, 1, half, 2, default=False,
           inferred=inferred),
        _p(f"1g.{n1}+me.all", 64, NVML_1_SLICE_ALL_ME, 1, s1, g1, 1, half, 1, default=False,
           me=True, inferred=inferred),
        _p(f"1g.{n1}-me", 66, NVML_1_SLICE_NO_ME, 1, s1, g1, 1, half, 2, default=False,
           inferred=inferred),
        _p(f"2g.{n2}", 0, NVML_2_SLICE, 2, s2, g2, 2, full, 1, inferred=inferred),
        _p(f"2g.{n2}+gfx", 32, NVML_2_SLICE_GFX, 2, s2, g2, 2, full, 1, default=False,
           inferred=inferred),
    ]
    return tuple(rows)


_RTX_PRO_INFERRED = ("profile_id", "nvml_index", "sm_count", "memory_gib", "placements")

GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel(
            "A100-40GB", "NVIDIA A100-SXM4-40GB / A100-PCIE-40GB / A800-40GB",
            ("0x20B0", "0x20B1", "0x20F1", "0x20F6"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("5gb", "10gb", "20gb", "40gb"), (4.75, 9.62, 19.50, 39.25),
                                 _A100_SMS, min_double=525, min_me=470),
            aliases=("A100-SXM4-40GB", "A100-PCIE-40GB", "A800-40GB", "A100"),
            notes="-lgip/-lgipp from the MIG user guide; 1g.5gb+me needs R470+, 1g.10gb R525+.",
            legacy_4g3g_ban=True, min_driver="450.80.02",
            sources=(UG_PROF + " (A100 table and notes)", "MIG user guide, Getting Started "
                     "(-lgip/-lgipp)", MIG_PARTED + " (A100-40GB, A800-40GB filter)", UG_DRV),
        ),
        GpuModel(
            "A100-80GB", "NVIDIA A100-SXM4-80GB / A100-PCIE-80GB / A800-80GB",
            ("0x20B2", "0x20B5", "0x20F3", "0x20F5"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("10gb", "20gb", "40gb", "80gb"), (9.50, 19.50, 39.25, 79.25),
                                 _A100_SMS, min_double=525, min_me=470, common=_PL,
                                 inferred={"7g": ("memory_gib",)}),
            aliases=("A100-SXM4-80GB", "A100-PCIE-80GB", "A800-80GB"),
            notes="Same IDs as A100-40GB, names per the user guide; 1g/2g/3g GiB and SMs from "
                  "mig-parted #97; placements (as A100-40GB) and the 7g GiB are inferred.",
            legacy_4g3g_ban=True, min_driver="450.80.02",
            sources=(UG_PROF + " (A100-80GB names)", "mig-parted issue #97 (-lgip)",
                     MIG_PARTED + " (A100-80GB, A800-80GB filter)", UG_DRV),
        ),
        GpuModel(
            "A30-24GB", "NVIDIA A30", ("0x20B7",),
            units=4, compute_slices=4, max_instances=4,
            profiles=(
                _p("1g.6gb", 14, NVML_1_SLICE, 1, 14, 5.81, 1, (0, 1, 2, 3), 4),
                _p("1g.6gb+me", 21, NVML_1_SLICE_REV1, 1, 14, 5.81, 1, (0, 1, 2, 3), 1,
                   default=False, me=True, min_driver=470),
                _p("2g.12gb", 5, NVML_2_SLICE, 2, 28, 11.69, 2, (0, 2), 2),
                _p("2g.12gb+me", 6, NVML_2_SLICE_REV1, 2, 28, 11.69, 2, (0, 2), 1,
                   default=False, me=True, min_driver=525),
                _p("4g.24gb", 0, NVML_4_SLICE, 4, 56, 23.44, 4, (0,), 1),
            ),
            aliases=("A30",),
            notes="-lgip/-lgipp capture on driver 535.183.01; 4 placement units. "
                  "1g.6gb+me needs R470+, 2g.12gb+me R525+ (user guide).",
            min_driver="460.73.01",
            sources=(UG_PROF + " (A30 table and notes)", "public -lgip/-lgipp capture, driver "
                     "535.183.01", MIG_PARTED + " (A30-24GB filter)", UG_DRV),
        ),
        GpuModel(
            "H100-80GB", "NVIDIA H100 80GB HBM3 (SXM5) / H800 (SXM5)", ("0x2330", "0x2324"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("10gb", "20gb", "40gb", "80gb"), (9.75, 19.62, 39.50, 79.25),
                                 _HOPPER_SMS),
            aliases=("H100-SXM5-80GB", "H800-80GB", "H800-SXM5", "H100"),
            notes="SXM5 -lgip/-lgipp capture. mig-parted groups H800-80GB with H100-80GB; that "
                  "0x2324 is the SXM5 H800 (same SMs as H100 SXM5) is inferred.",
            min_driver="525.85.12",
            sources=(UG_PROF + " (H100 80GB table)", "public H100 SXM5 -lgip/-lgipp capture",
                     MIG_PARTED + " (H100-80GB, H800-80GB filter)", UG_DRV),
        ),
        GpuModel(
            "H100-PCIE-80GB", "NVIDIA H100 PCIe 80GB / H800 PCIe 80GB", ("0x2331", "0x2322"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("10gb", "20gb", "40gb", "80gb"), (9.75, 19.62, 39.50, 79.25),
                                 (14, 14, 30, 46, 62, 114), common=_PL),
            aliases=("H800-PCIE-80GB",),
            notes="PCIe -lgip on driver 570.169; placements inferred from SXM5. That 0x2322 is "
                  "the PCIe H800 (same SMs as H100 PCIe) is inferred.",
            min_driver="525.85.12",
            sources=(UG_PROF + " (H100 80GB table)", "public H100 PCIe -lgip capture, driver "
                     "570.169", MIG_PARTED + " (H100-80GB, H800-80GB filter)", UG_DRV),
        ),
        GpuModel(
            "H100-94GB", "NVIDIA H100 NVL 94GB / H800 NVL", ("0x2321", "0x233A"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("12gb", "24gb", "47gb", "94gb"), (10.75, 21.62, 46.38, 93.12),
                                 _HOPPER_SMS),
            aliases=("H100-NVL", "H800-NVL"),
            notes="-lgip from gpu-operator #900/#903 and mig-parted #101, -lgipp from an H100 "
                  "NVL capture; H800 NVL shares the mig-parted filter.",
            min_driver="525.85.12",
            sources=(UG_PROF + " (H100 94GB table)", "gpu-operator #900/#903, mig-parted #101 "
                     "(-lgip)", "public H100 NVL -lgipp capture",
                     MIG_PARTED + " (H100 NVL, H800 NVL filter)", UG_DRV),
        ),
        GpuModel(
            "H100-96GB", "NVIDIA H100 96GB (GH200 96GB / H100 96GB / PG506-96GB / H20)",
            ("0x2342", "0x233D", "0x20B6", "0x2329"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("12gb", "24gb", "48gb", "96gb"), (11.00, 23.00, 46.50, 93.00),
                                 _HOPPER_SMS, common=_PL),
            aliases=("GH200-96GB", "GH200", "H20", "H20-96GB", "PG506-96GB"),
            notes="GH200 -lgip; placements inferred from H100 80GB. mig-parted puts GH200, "
                  "H100-96GB, PG506-96GB and H20 in one filter without saying which id is which. "
                  "H20 SM counts are not published and likely lower (about 78 SMs reported).",
            min_driver="525.85.12",
            sources=(UG_PROF + " (H100 96GB table)", "public GH200 -lgip capture",
                     MIG_PARTED + " (H100-96GB, PG506-96GB, GH200, H20 filter)",
                     UG_DRV + " (H100; H20 needs 535.161.07)"),
        ),
        GpuModel(
            "GH200-144GB", "NVIDIA GH200 144G HBM3e", ("0x2348",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("18gb", "36gb", "72gb", "144gb"), (17.50, 35.25, 72.0, 144.0),
                                 _HOPPER_SMS, common=_PL,
                                 inferred={k: ("sm_count", "memory_gib") for k in
                                           ("3g", "4g", "7g")}),
            aliases=("GH200-144GB-HBM3E",),
            notes="-lgip rows 1g/1g+me/1g.36gb/2g from mig-parted #139 / gpu-operator #1057; "
                  "3g/4g/7g SMs (60/64/132) and memory inferred; placements inferred.",
            min_driver="",
            sources=("mig-parted #139, gpu-operator #1057 (-lgip)",
                     MIG_PARTED + " (GH200 144G HBM3e filter)"),
        ),
        GpuModel(
            "H200-141GB", "NVIDIA H200 141GB (SXM / NVL)", ("0x2335", "0x233B"),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("18gb", "35gb", "71gb", "141gb"),
                                 (16.00, 32.25, 69.50, 139.75), _HOPPER_SMS, common=_PL),
            aliases=("H200", "H200-NVL"),
            notes="-lgip from mig-parted #120 (H200 SXM); placements inferred (same fractions "
                  "as H100); H200 NVL shares the filter, its SM/GiB rows were not seen.",
            min_driver="550.90.07",
            sources=(UG_PROF + " (H200 table)", "mig-parted #120 (-lgip)",
                     MIG_PARTED + " (H200 141GB, H200 NVL filter)", UG_DRV),
        ),
        GpuModel(
            "B200-180GB", "NVIDIA B200 180GB", ("0x2901",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("23gb", "45gb", "90gb", "180gb"),
                                 (20.50, 44.25, 89.00, 178.50), _B200_SMS, common=_PL),
            aliases=("B200",),
            notes="gpu-operator #1242/#1351, mig-parted #166/#187 (1g.23gb 20.50 GiB on the "
                  "Mar-2025 driver); 3g/4g/7g from a third-party -lgip; placements inferred.",
            min_driver="570.133.20",
            sources=(UG_PROF + " (B200 table)", "gpu-operator #1242/#1351, mig-parted "
                     "#166/#187 (-lgip)", MIG_PARTED + " (B200 filter)", UG_DRV),
        ),
        GpuModel(
            "GB200-186GB", "NVIDIA GB200 (HGX GB200)", ("0x2941",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("23gb", "47gb", "93gb", "186gb"), (22.00, 45.50, 93.0, 186.0),
                                 (18, 32, 38, 70, 72, 148), common=_PL,
                                 inferred={k: ("sm_count", "memory_gib") for k in
                                           ("3g", "4g", "7g")}),
            aliases=("GB200",),
            notes="Production names of mig-parted #227/#228 (earlier drivers: 1g.24gb, 3g.95gb, "
                  "4g.95gb, 7g.189gb); 1g/2g -lgip from #227; 3g/4g/7g SMs taken from B200 and "
                  "memory nominal (inferred); placements inferred.",
            min_driver="570.133.20",
            sources=(UG_GPUS + " (GB200 186GB, 7 instances)", "mig-parted #227/#228 (-lgip)",
                     MIG_PARTED + " (GB200 HGX filter)", UG_DRV),
        ),
        GpuModel(
            "B300-288GB", "NVIDIA B300 (Blackwell Ultra)", ("0x3182",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("34gb", "67gb", "135gb", "269gb"),
                                 (34.0, 67.0, 135.0, 269.0), _B200_SMS,
                                 common=("placements", "profile_id", "memory_gib"),
                                 inferred={k: ("sm_count",) for k in
                                           ("1g2", "2g", "3g", "4g", "7g")}),
            aliases=("B300",),
            notes="Names and counts from mig-parted's config and the gpu-operator v25.10.0 "
                  "release notes; ids, memory and placements inferred from B200; SMs inferred "
                  "from B200 (a third-party run reports 18 SMs on 1g.34gb).",
            min_driver="580.82.07",
            sources=(MIG_PARTED + " (B300 filter)", "gpu-operator v25.10.0 release notes",
                     UG_DRV),
        ),
        GpuModel(
            "GB300-288GB", "NVIDIA GB300 (DGX Station / NVL72)", ("0x31C2",),
            units=8, compute_slices=7, max_instances=7,
            profiles=_eight_unit(("35gb", "70gb", "139gb", "278gb"),
                                 (35.0, 70.0, 139.0, 278.0), _B200_SMS,
                                 common=("placements", "memory_gib", "sm_count")),
            aliases=("GB300",),
            notes="Names and counts from mig-parted's config; profile ids 19/20/15/14/9/5/0 from "
                  "a third-party DGX Station -lgip note (R61x drivers rename 1g.35gb to 1g.31gb, "
                  "3g.139gb to 3g.126gb, 7g.278gb to 7g.251gb); SMs, memory, placements inferred.",
            min_driver="595.58.03",
            sources=(MIG_PARTED + " (GB300 filter)", "third-party DGX Station -lgip note",
                     UG_DRV + " (GB300 DGX Station)"),
        ),
        GpuModel(
            "RTX-PRO-6000", "NVIDIA RTX PRO 6000 Blackwell (Server / Workstation / Max-Q)",
            ("0x2BB5",),
            units=12, compute_slices=4, max_instances=4,
            profiles=(
                _p("1g.24gb", 14, NVML_1_SLICE, 1, 46, 23.62, 3, (0, 3, 6, 9), 4),
                _p("1g.24gb+me", 21, NVML_1_SLICE_REV1, 1, 46, 23.62, 3, (0, 3, 6, 9), 1,
                   default=False, me=True),
                _p("1g.24gb+gfx", 47, NVML_1_SLICE_GFX, 1, 46, 23.62, 3, (0, 3, 6, 9), 4,
                   default=False),
                _p("1g.24gb+me.all", 65, NVML_1_SLICE_ALL_ME, 1, 46, 23.62, 3, (0, 3, 6, 9), 1,
                   default=False, me=True),
                _p("1g.24gb-me", 67, NVML_1_SLICE_NO_ME, 1, 46, 23.62, 3, (0, 3, 6, 9), 4,
                   default=False),
                _p("2g.48gb", 5, NVML_2_SLICE, 2, 94, 47.38, 6, (0, 6), 2),
                _p("2g.48gb+gfx", 35, NVML_2_SLICE_GFX, 2, 94, 47.38, 6, (0, 6), 2,
                   default=False),
                _p("2g.48gb+me.all", 64, NVML_2_SLICE_ALL_ME, 2, 94, 47.38, 6, (0, 6), 1,
                   default=False, me=True),
                _p("2g.48gb-me", 66, NVML_2_SLICE_NO_ME, 2, 94, 47.38, 6, (0, 6), 2,
                   default=False),
                _p("4g.96gb", 0, NVML_4_SLICE, 4, 188, 95.00, 12, (0,), 1),
                _p("4g.96gb+gfx", 32, NVML_4_SLICE_GFX, 4, 188, 95.00, 12, (0,), 1,
                   default=False),
            ),
            aliases=("RTX-PRO-6000-BLACKWELL", "RTXPRO6000"),
            notes="-lgip on driver 580.105.08 and -lgipp capture; 12 placement units. "
                  "+gfx/+me.all/-me rows share the plain rows' placements.",
            min_driver="575.51.03",
            sources=(UG_PROF + " (RTX PRO 6000 Blackwell table)", "public -lgip/-lgipp capture, "
                     "driver 580.105.08; GoogleCloudPlatform/container-engine-accelerators #564",
                     MIG_PARTED + " (RTX PRO 6000 filter and +gfx/+me.all/-me configs)", UG_DRV),
        ),
        GpuModel(
            "RTX-PRO-5000", "NVIDIA RTX PRO 5000 Blackwell 48GB", (),
            units=2, compute_slices=2, max_instances=2,
            profiles=_rtx_pro(("24gb", "48gb"), (23.62, 47.38), (55, 110), has_me=True,
                              inferred=_RTX_PRO_INFERRED),
            aliases=("RTX-PRO-5000-BLACKWELL", "RTXPRO5000"),
            notes="Names, fractions and counts from the user guide; no -lgip/-lgipp capture and "
                  "no PCI id in mig-parted: ids, SMs (110 SMs split in half), memory and the "
                  "2-unit placement grid are inferred. Matched by device name.",
            min_driver="575.57.08", device_names=("RTX PRO 5000 Blackwell",),
            sources=(UG_PROF + " (RTX PRO 5000 Blackwell table)", UG_GPUS + " (2 instances)",
                     UG_DRV),
        ),
        GpuModel(
            "RTX-PRO-4500", "NVIDIA RTX PRO 4500 Blackwell 32GB", (),
            units=2, compute_slices=2, max_instances=2,
            profiles=_rtx_pro(("16gb", "32gb"), (16.0, 32.0), (41, 82), has_me=False,
                              inferred=_RTX_PRO_INFERRED),
            aliases=("RTX-PRO-4500-BLACKWELL", "RTXPRO4500"),
            notes="Names, fractions and counts from the user guide (no plain +me profile); no "
                  "-lgip/-lgipp capture and no PCI id in mig-parted: ids, SMs (82 SMs split in "
                  "half), memory and the 2-unit grid are inferred. Matched by device name.",
            min_driver="575.64", device_names=("RTX PRO 4500 Blackwell",),
            sources=(UG_PROF + " (RTX PRO 4500 Blackwell table)", "MIG user guide r610, "
                     "Supported GPUs (2 instances)", UG_DRV),
        ),
    )
}
