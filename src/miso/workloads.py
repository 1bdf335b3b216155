"""The workload catalogue: real A100-40GB per-slice speeds and memory of 32 training jobs.

The numbers come from the MISO artifact (see ``miso/data/README.md``). Speeds are relative to the
full GPU (7g), so 1.0 means "as fast as alone on the whole GPU". Other GPU models reuse the same
relative speeds by compute-slice count (a 3g slice of an H100 gets the 3g figure); this is an
approximation stated wherever a non-A100 model is simulated or emulated.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

#: Compute-slice counts measured in the A100 table, largest first.
MEASURED_SLICES: tuple[int, ...] = (7, 4, 3, 2, 1)


@dataclass(frozen=True)
class Workload:
    """One training workload: relative speed per compute-slice count and peak memory.

    ``speed_by_slices`` maps compute slices (7, 4, 3, 2, 1) to speed relative to the full GPU.
    A slice count missing from the map means the job did not fit there on the A100-40GB.
    """

    name: str
    model: str
    batch_size: int
    speed_by_slices: dict[int, float]
    memory_gb: float

    def speed(self, compute_slices: int) -> float | None:
        """Speed on a slice with this many compute slices, or None if it was not measured."""
        return self.speed_by_slices.get(compute_slices)

    def speed_at(self, slices: float) -> float:
        """Speed with a fractional number of A100 compute slices (an SM share of ``slices/7``).

        Linear between measured slice counts; below the smallest measured slice, proportional
        to compute; the one model of "speed for a share of the SMs" that the simulator, the
        per-model speed mapping and the emulated workload all use.
        """
        pts = sorted(self.speed_by_slices.items())
        if not pts:
            return 1.0
        if slices <= pts[0][0]:
            pts.insert(0, (0.0, 0.0))  # proportional to compute below the smallest slice
        got = piecewise_linear(pts, slices)
        return pts[-1][1] if got is None else got


def piecewise_linear(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """The value at ``x`` of the line through ``points`` (sorted by x), None outside them.

    The one slice-count-to-speed interpolation: the catalogue's :meth:`Workload.speed_at`,
    per-model speeds (:mod:`miso.sched.speeds`), the predictor's speeds on profiles between
    the slice counts it predicts and the MPS-profile heuristic (:mod:`miso.sched.estimators`).
    """
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return None


@cache
def catalogue() -> dict[str, Workload]:
    """All workloads of the shipped A100 table, by name (``MODEL_trainBATCH``)."""
    text = resources.files("miso.data").joinpath("mig_speed_a100_40gb.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    out: dict[str, Workload] = {}
    for row in rows:
        name = row["workload"]
        slices = int(row["slice"].split("g", 1)[0])
        wl = out.get(name)
        if wl is None:
            wl = Workload(
                name=name,
                model=row["model"],
                batch_size=int(row["batch_size"]),
                speed_by_slices={},
                memory_gb=float(row["peak_memory_mb"]) / 1024.0,
            )
            out[name] = wl
        if row["speed_vs_7g"].strip() and row["mean_iter_time_s"].strip():
            # Values slightly above 1.0 on a smaller slice are measurement noise: clamp.
            wl.speed_by_slices[slices] = min(1.0, float(row["speed_vs_7g"]))
    return out


def workload(name: str) -> Workload:
    """Look up one workload by name, with a clear error for unknown names."""
    cat = catalogue()
    if name not in cat:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(sorted(cat))}")
    return cat[name]


def family_of(workload: str) -> str:
    """A workload's model family: its name up to the first ``_`` (``bert_train8`` -> bert);
    the unit of "a model miso never saw" in the held-out predictors and priors."""
    return workload.split("_", 1)[0]
