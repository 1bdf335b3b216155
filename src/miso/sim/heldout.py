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

Variants (``predictor`` names of the simulator, :func:`parse_heldout`): ``heldout:FAMILY``
holds out one model family only (its jobs get held-out predictions, the others the paper's
Gaussian error: one new model among known ones); ``error_scale`` multiplies every held-out
error (prediction - truth), to see how a planner degrades with a worse predictor. Each estimate
carries the shipped model's calibrated 95 % interval (``interval``, half-widths sized for an
unseen family) and its residual covariance (``calibration``), as the live predictor's do.
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
from miso.workloads import family_of

FILE = "heldout_predictions.npz"


@cache
def heldout_table() -> dict[str, np.ndarray]:
    """Workload name -> (m, 2) held-out predicted speeds on 4g and 3g."""
    ref = resources.files("miso.data").joinpath("predictor", FILE)
    with resources.as_file(ref) as f, np.load(f, allow_pickle=False) as z:
        names, wl, pred = z["names"], z["workload"], z["pred"].astype(np.float64)
    return {str(names[w]): pred[wl == w] for w in np.unique(wl)}


def parse_heldout(name: str) -> tuple[str, ...] | None:
    """The families a ``heldout`` / ``heldout:FAMILY[,FAMILY]`` predictor name holds out
    (() = all), or None when ``name`` is no held-out predictor."""
    if name == "heldout":
        return ()
    if not name.startswith("heldout:"):
        return None
    fams = tuple(f for f in name.split(":", 1)[1].split(",") if f)
    known = families()
    bad = [f for f in fams if f not in known]
    if not fams or bad:
        raise ValueError(f"{name!r}: held-out families must be among {', '.join(known)}")
    return fams


@cache
def families() -> tuple[str, ...]:
    """Model families with held-out predictions (``bert`` of ``bert_train8``)."""
    return tuple(sorted({family_of(w) for w in heldout_table()}))


@cache
def shipped_calibration() -> object | None:
    """The shipped per-job model's calibration (:class:`miso.predict.uncertainty.Calibration`),
    or None where the weights are missing."""
    try:
        from miso.sched.estimators import load_predictor

        return load_predictor().calibration
    except Exception:  # noqa: BLE001 - optional: intervals are then absent
        return None


class HeldOutPredictions:
    """Speed estimator with real held-out-family prediction errors (see the module docstring)."""

    needs_profile = True

    def __init__(self, seed: int = 0, families: tuple[str, ...] = (),
                 error_scale: float = 1.0) -> None:
        self.seed = seed
        self.families = tuple(families)
        self.error_scale = float(error_scale)
        self.fallback = NoisyOracle(seed=seed)
        self.uncertainty: dict[str, dict[str, float]] = {}  # none: the errors are the point
        #: per job {profile: (lo, hi)}: the shipped model's 95 % interval around the estimate
        self.interval: dict[str, dict[str, tuple[float, float]]] = {}
        self.calibration = shipped_calibration()
        self._cache: dict[tuple[str, str], dict[str, float]] = {}

    def _held_out(self, workload: str) -> bool:
        return not self.families or family_of(workload) in self.families

    def _by_slices(self, job: str, rows: np.ndarray, truth: dict[str, float] | None = None
                   ) -> tuple[list[float], list[float]]:
        from miso.predict.lowslice import fit_lowslice

        rng = np.random.default_rng([self.seed, zlib.crc32(job.encode())])
        s4, s3 = rows[int(rng.integers(len(rows)))]
        if self.error_scale != 1.0 and truth and {"4g.20gb", "3g.20gb"} <= set(truth):
            t4, t3 = truth["4g.20gb"], truth["3g.20gb"]
            k = self.error_scale
            s4, s3 = (float(np.clip(t + k * (s - t), 0.02, 1.0))
                      for s, t in ((s4, t4), (s3, t3)))
            s3 = min(s3, s4)
        low = fit_lowslice().predict(np.array([s4]), np.array([s3]))
        return [1.0, 2.0, 3.0, 4.0, 7.0], [float(low[1][0]), float(low[2][0]), s3, s4, 1.0]

    def estimate(self, geom: Geometry, jobs: Sequence[JobState],
                 profile: Mapping[str, tuple[float, ...]] | None = None
                 ) -> dict[str, dict[str, float]]:
        table = heldout_table()
        out: dict[str, dict[str, float]] = {}
        full = geom.model.full_profile()
        for j in jobs:
            wl = j.spec.workload or ""
            rows = table.get(wl)
            if rows is None or len(rows) == 0 or not self._held_out(wl):
                out[j.id] = self.fallback.estimate(geom, [j])[j.id]
                continue
            key = (geom.model.name, j.id)
            got = self._cache.get(key)
            if got is None:
                fits = true_speeds(geom, j)
                xs, ys = self._by_slices(j.id, rows, workload_truth(wl))
                got = {p.name: (1.0 if p.name == full.name else float(np.interp(
                    7.0 * p.compute_slices / full.compute_slices, xs, ys)))
                       for p in geom.profiles if p.name in fits}
                self._cache[key] = got
            out[j.id] = dict(got)
            if self.calibration is not None:
                self.interval[j.id] = self._interval(geom, got)
        return out

    def _interval(self, geom: Geometry, got: Mapping[str, float]
                  ) -> dict[str, tuple[float, float]]:
        full = geom.model.full_profile()
        half = self.calibration.half  # type: ignore[attr-defined]
        out = {}
        for p in geom.profiles:
            g = round(7.0 * p.compute_slices / full.compute_slices)
            if p.name in got and p.name != full.name and g in half:
                s = got[p.name]
                out[p.name] = (max(0.0, s - half[g]), min(1.0, s + half[g]))
        return out


@cache
def workload_truth(workload: str) -> dict[str, float] | None:
    """True A100-40GB 4g/3g speeds of a catalogue workload (for ``error_scale``)."""
    from miso.mig import geometry
    from miso.sched.speeds import workload_speeds
    from miso.workloads import catalogue

    w = catalogue().get(workload)
    return None if w is None else workload_speeds(geometry("A100-40GB"), w)
