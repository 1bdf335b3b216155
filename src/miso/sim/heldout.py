"""``predictor="heldout"``: speeds as a predictor that never saw the job's model family gives them.

Instead of an injected Gaussian (the paper's error model) or the predictor run on synthetic MPS
profiles, each job's 4g/3g speed estimate is one of the real held-out predictions of its
workload: what the shipped per-job model configuration, trained without the workload's whole
model family, predicted for that workload in a real MISO mix
(``miso/data/predictor/heldout_predictions.npz``, written by
``benchmarks/predictor/heldout_predictions.py``). 2g/1g follow from the linear 2g/1g model, so
the errors keep their real size and their correlation across slices. A workload absent from the
data falls back to :class:`miso.sched.NoisyOracle`. Drawn per (seed, job), independent of call
order.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources

import numpy as np

from miso.mig import Geometry
from miso.sched import JobState, NoisyOracle
from miso.sched.estimators import true_speeds

FILE = "heldout_predictions.npz"


@cache
def heldout_table() -> dict[str, np.ndarray]:
    """Workload name -> (m, 2) held-out predicted speeds on 4g and 3g."""
    ref = resources.files("miso.data").joinpath("predictor", FILE)
    with resources.as_file(ref) as f, np.load(f, allow_pickle=False) as z:
        names, wl, pred = z["names"], z["workload"], z["pred"].astype(np.float64)
    return {str(names[w]): pred[wl == w] for w in np.unique(wl)}


class HeldOutPredictions:
    """Speed estimator with real held-out-family prediction errors (see the module docstring)."""

    needs_profile = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.fallback = NoisyOracle(seed=seed)
        self.uncertainty: dict[str, dict[str, float]] = {}  # none: the errors are the point
        self._cache: dict[tuple[str, str], dict[str, float]] = {}

    def _by_slices(self, job: str, rows: np.ndarray) -> tuple[list[float], list[float]]:
        from miso.predict.lowslice import fit_lowslice

        rng = np.random.default_rng([self.seed, zlib.crc32(job.encode())])
        s4, s3 = rows[int(rng.integers(len(rows)))]
        low = fit_lowslice().predict(np.array([s4]), np.array([s3]))
        return [1.0, 2.0, 3.0, 4.0, 7.0], [float(low[1][0]), float(low[2][0]), s3, s4, 1.0]

    def estimate(self, geom: Geometry, jobs: Sequence[JobState],
                 profile: Mapping[str, tuple[float, ...]] | None = None
                 ) -> dict[str, dict[str, float]]:
        table = heldout_table()
        out: dict[str, dict[str, float]] = {}
        full = geom.model.full_profile()
        for j in jobs:
            rows = table.get(j.spec.workload or "")
            if rows is None or len(rows) == 0:
                out[j.id] = self.fallback.estimate(geom, [j])[j.id]
                continue
            key = (geom.model.name, j.id)
            got = self._cache.get(key)
            if got is None:
                xs, ys = self._by_slices(j.id, rows)
                fits = true_speeds(geom, j)
                got = {p.name: (1.0 if p.name == full.name else float(np.interp(
                    7.0 * p.compute_slices / full.compute_slices, xs, ys)))
                       for p in geom.profiles if p.name in fits}
                self._cache[key] = got
            out[j.id] = dict(got)
        return out
