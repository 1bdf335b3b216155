"""The shape of the MIG tables: one GPU model and its GPU-instance profiles, checked on build.

The rows themselves are :mod:`miso.mig.tabledata`; the lookups, :mod:`miso.mig.tables`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Values a profile's ``inferred`` may name.
INFERABLE = ("profile_id", "nvml_index", "sm_count", "memory_gib", "placements", "max_count")


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile of one GPU model.

    ``profile_id`` is the per-device ID that nvidia-smi prints and NVML's placement/create calls
    take; IDs are *not* global across models. ``default`` marks the profiles the scheduler uses
    unless told otherwise: one profile per compute-slice count, no media/graphics variants.
    ``min_driver`` is the driver major a profile first appears in; ``inferred`` names the values
    not published for this exact GPU (see :mod:`miso.mig.tabledata`).
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
    inferred: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model (or profile group): placement units, compute slices, profiles.

    ``min_driver`` is the MIG user guide's minimum driver for the model (r620 *Deployment
    considerations*), informational: the tables do not refuse older drivers. ``sources`` says
    where the rows come from.
    """

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
    min_driver: str = ""
    sources: tuple[str, ...] = ()
    #: NVML device-name substrings that identify a model the tables have no PCI id for.
    device_names: tuple[str, ...] = ()
    _by_name: dict[str, Profile] = field(default_factory=dict, compare=False, repr=False)
    #: default_profiles() and full_profile(), computed once (schedulers ask per event).
    _derived: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for p in self.profiles:
            self._by_name[p.name] = p
            if p.size > self.units or any(s + p.size > self.units for s in p.starts):
                raise ValueError(f"{self.name}: profile {p.name} placed beyond {self.units} units")
            unknown = set(p.inferred) - set(INFERABLE)
            if unknown:
                raise ValueError(f"{self.name}: profile {p.name} infers unknown {unknown}")

    def profile(self, name: str) -> Profile:
        """The profile called ``name`` (e.g. ``"3g.20gb"``), with a clear error if unknown."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(p.name for p in self.profiles)
            raise KeyError(f"GPU {self.name} has no MIG profile {name!r}; known: {known}") from None

    def default_profiles(self) -> tuple[Profile, ...]:
        """Profiles the scheduler uses by default, largest first."""
        got = self._derived.get("defaults")
        if got is None:
            got = self._derived["defaults"] = tuple(
                sorted((p for p in self.profiles if p.default), key=lambda p: -p.compute_slices))
        return got  # type: ignore[return-value]

    def full_profile(self) -> Profile:
        """The profile that spans the whole GPU (7g on most models, 4g on A30 and RTX PRO)."""
        got = self._derived.get("full")
        if got is None:
            got = self._derived["full"] = max(self.default_profiles(),
                                              key=lambda p: (p.compute_slices, p.size))
        return got  # type: ignore[return-value]

    @property
    def inferred(self) -> bool:
        """True when any of the model's values is inferred rather than published."""
        return any(p.inferred for p in self.profiles)
