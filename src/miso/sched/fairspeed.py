"""Fair slices sized by speed, not by compute slices (issue 31): a protected owner's running
job that loses speed on small slices is owed a larger one. Pure: no I/O. Shipped in miso+'s
entitlement filter (:class:`SpeedFloor`; ``MisoPlus.filters``).

**Why.** A fair slice is a size (``fair_cap``: 4g of an A100 at 1.6x the cluster, 2g at
3.25x), but what an owner's sharing incentive measures is speed: its jobs' completion times
against what they would get alone on its share, mostly whole GPUs. The same 4g slice gives a
small model 0.9 of its whole-GPU speed and a large transformer 0.57 (the catalogue's A100
curves); measured at 1.6x, seed 3, the light owner's transformers on 3g/4g slices carried two
thirds of its slowdown (benchmarks/history/2026-12-03-h11-fair.md).

**The rule** (:class:`SpeedFloor`). A job's slice curve is estimated from what is known of
every job at submission, its memory (:func:`~miso.sched.memoryprior.memory_prior`: the
catalogue workloads of similar memory, the job's own model family left out). The fair slice
a job is owed is raised to the smallest profile on which that estimate reaches ``part`` times
the catalogue's average speed on the owed size (:func:`~miso.sched.speeds.prior_speeds`):
what an average job gets there. Only raised, never lowered, and only for a protected owner
(below its entitlement) with a stated price, so the heavy owner pays only while the light one
is under-served.

**When** (:meth:`~miso.sched.policies.entitled.Entitled.fair_slices`): only while the packed
share is above the smallest slice (packing pressure, not a queue: in a queue Philly by vc's
short jobs of large memory waited for whole GPUs, h12-fair) and only for a running job (the
raise is what the next re-plan grows it to in place; a queued job is placed at its unraised
fair slice: owed at placement, three raises moved Philly by vc at 5 %, seed 2, from +1.51 to
+4.06 %, over its 3 % target, h13-fair). Measured (two owners 80/20, 16 A100-40GB, price 5 %,
seeds 1-3; benchmarks/history/2026-12-03-h13-fair.md): 1.6x the cluster +6.79 / +2.32 /
+3.80 % -> +3.98 / +0.48 / +3.71 %, light owner 1.294 / 1.284 / 1.318 -> 1.285 / 1.253 /
1.297 (issue 31's target <= 1.30 at <= 5 %: met on all three); Philly by vc at 5 % +1.39 /
+1.51 / +0.96 % -> +1.26 / +1.22 / +0.34 %, max sharing incentive 1.42 -> 1.40; 0.9x met
(+3.12 / +3.19 / +3.18 %, every owner <= 1.01). Its cost: saturated (3.25x) the price falls
(+3.49 / +6.88 / +5.16 -> -0.35 / +5.10 / +3.79 %) but the light owner is worse on seeds 1-2
(1.557 / 1.606 -> 1.892 / 1.710; neutral reorders of main give 1.86-1.90 / 1.62-1.63).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from miso.mig import Geometry
from miso.sched.memoryprior import memory_prior
from miso.sched.speeds import prior_speeds

#: The part of an average job's speed on the owed size a job's own estimate must reach there
#: (below it, the next size up is owed). Measured at 1.6x, seeds 1-8 (h12-fair): 0.85-0.9
#: +5.47 % / light 1.275, 0.92-0.95 +4.78 % / 1.264 (the 9-10 GB jobs owed 3g get a whole
#: GPU, not 4g), 0.97 +7.45 % / 1.278 (small jobs owed 2g get 3g), 1.0 dearer still.
SPEED_PART = 0.93


def speed_floor(geom: Geometry, owed: frozenset[str], memory_gb: float, workload: str,
                part: float = SPEED_PART) -> frozenset[str]:
    """``owed`` (the profiles a job is owed, smallest first or any order) without its sizes on
    which the job's memory-prior speed is under ``part`` of the catalogue's average speed on
    the smallest owed size; ``owed`` itself when that would leave none."""
    model = geom.model
    floor = min(owed, key=lambda p: (model.profile(p).compute_slices, p))
    avg = prior_speeds(geom, 0.0)
    sp = memory_prior(geom, prior_speeds(geom, memory_gb), memory_gb, workload)
    top = max(sp.values())
    need = min(1.0, avg.get(floor, 1.0) * part) * top
    ok = frozenset(p for p in owed if sp.get(p, 0.0) >= need - 1e-9)
    return ok or owed


@dataclass(frozen=True)
class SpeedFloor:
    """A fair-slice plugin of the entitlement filter (:class:`~miso.sched.policies.framework.
    Entitlement`): the owed sizes raised for jobs that lose speed on them (:func:`speed_floor`)."""

    part: float = SPEED_PART
    name: ClassVar[str] = "speed_floor"

    def owed(self, geom: Geometry, owed: frozenset[str], memory_gb: float,
             workload: str | None) -> frozenset[str]:
        return speed_floor(geom, owed, memory_gb, workload or "", self.part)

