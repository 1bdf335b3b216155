"""A job's other slices from one measured slice, by the slice curves of similar known workloads.

Gaussian conditioning (:func:`miso.predict.uncertainty.condition`) moves every slice by one
population-wide correlation. Real slice curves differ in shape (a small model saturates, so its
2g is near its 3g; a large one keeps losing speed), so the curve of the known workloads nearest
to the job, in its measured speed and its own MPS profile, is a second opinion.

What is carried over from the neighbours is the *overhead* ratio, not the speed ratio: with
``x(s) = 1/s - 1`` (the extra time per iteration over the full GPU), the job's ``x`` on slice h is
``x(measured) x geomean(x_h / x_g)`` over the ``k`` nearest workloads. A time that splits into
a part that scales with the slice and a part that does not gives exactly that ratio whatever the
split's size, so a job near the full GPU's speed (little overhead) keeps little overhead on the
small slices, where a speed ratio would drag it down to its neighbours' curve (mobilenet at 4g
0.98: 1g 0.81, the speed ratio of its neighbours says 0.56). Half and half with the Gaussian
conditioning, after any measured slice, beats the speed-ratio curves of the previous pass on
leave-one-family-out after every measured slice and with two model seeds (benchmarks/README.md,
"Predictor, fourth pass"). Pure numpy; the table (real A100 speeds of the training workloads
and their mean MPS profiles) lives in the predictor's meta.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from miso.predict.uncertainty import VAR_SLICES, monotone_fixed

#: Neighbours averaged and the weight of the MPS-profile distance against the measured
#: speed's; the share of this estimate in the blend with the Gaussian conditioning, by measured
#: slice (chosen on leave-one-family-out, benchmarks/README.md). With the job's memory known,
#: the Gaussian estimate, the curves and the memory regression count a third each instead.
K, MPS_WEIGHT = 3, 0.05
BLEND: dict[int, float] = {4: 0.5, 3: 0.5, 2: 0.5, 1: 0.5}
#: the previous pass's shares (speed-ratio curves misled after a measured 1g slice)
BLEND_RATIO: dict[int, float] = {4: 0.5, 3: 0.5, 2: 0.5, 1: 0.0}
#: How a neighbour's curve is carried over: "overhead" (default, ratios of 1/s - 1, floored at
#: OVERHEAD_FLOOR so that a speed measured at ~1 on a smaller slice, noise, stays finite) or
#: "ratio" (speed ratios s_h / s_g, the previous pass).
TRANSFERS = ("overhead", "ratio")
OVERHEAD_FLOOR = 0.02
#: Memory of the A100-40GB slices by compute slices: the regression's memory feature is the
#: job's memory need over the target slice's (a job near a slice's limit slows down there).
SLICE_MEMORY_GB: dict[int, float] = {4: 20.0, 3: 20.0, 2: 10.0, 1: 5.0}
#: The memory feature is capped here, at the training data's range: peak memory is measured on
#: the full GPU and is no hard need (resnet at 9.9 GB runs on the 5 GB slice, fill 1.94).
MAX_FILL = 2.0


def overhead(speed: np.ndarray | float) -> np.ndarray:
    """``1/s - 1`` floored at OVERHEAD_FLOOR: extra time per iteration over the full GPU's."""
    return np.maximum(1.0 / np.asarray(speed, dtype=np.float64) - 1.0, OVERHEAD_FLOOR)


def own_features(norm: np.ndarray) -> np.ndarray:
    """Data-convention profiles (3, n) (time at 100/50/14 % over its max) -> (n, 5): the
    logs and the two log ratios (the first five of :func:`miso.predict.perjob.job_features`)."""
    lx = np.log(np.clip(np.asarray(norm, dtype=np.float64), 1e-6, 1.0)).T
    return np.concatenate([lx, lx[:, :1] - lx[:, 1:]], axis=1)


@dataclass(frozen=True)
class SliceCurves:
    """Known workloads: speeds (m, 4) on 4/3/2/1 compute slices (NaN: not measured), mean
    own-profile features (m, 5) and, optionally, memory needs in GB (m,)."""

    speed: np.ndarray
    feats: np.ndarray
    memory_gb: np.ndarray | None = None

    def as_dict(self) -> dict:
        d = {"speed": [[None if not np.isfinite(v) else round(float(v), 5) for v in r]
                       for r in self.speed],
             "feats": np.round(self.feats, 5).tolist()}
        if self.memory_gb is not None:
            d["memory_gb"] = np.round(self.memory_gb, 4).tolist()
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> SliceCurves:
        sp = np.array([[np.nan if v is None else float(v) for v in r] for r in d["speed"]],
                      dtype=np.float64)
        ft = np.asarray(d["feats"], dtype=np.float64)
        if sp.ndim != 2 or sp.shape[1] != len(VAR_SLICES) or ft.shape != (len(sp), 5):
            raise ValueError(f"slice curves: speed (m, 4) and feats (m, 5), got {sp.shape} "
                             f"and {ft.shape}")
        mem = d.get("memory_gb")
        if mem is None:
            return cls(sp, ft)
        mg = np.asarray(mem, dtype=np.float64)
        if mg.shape != (len(sp),):
            raise ValueError(f"slice curves: memory_gb ({len(sp)},), got {mg.shape}")
        return cls(sp, ft, mg)

    @cached_property
    def pairs(self) -> dict[tuple[int, int], np.ndarray]:
        """Least squares per (measured, target) slice pair over the known workloads:
        ``log overhead(s_h) = c0 + c1 log overhead(s_g) + c2 fill`` with ``fill`` the memory
        need over SLICE_MEMORY_GB[h], capped at MAX_FILL
        (empty without memory needs; pairs with fewer than 5 workloads are left out)."""
        out: dict[tuple[int, int], np.ndarray] = {}
        if self.memory_gb is None:
            return out
        lx = np.log(overhead(np.where(np.isfinite(self.speed), self.speed, 1.0)))
        for io, g in enumerate(VAR_SLICES):
            for ih, h in enumerate(VAR_SLICES):
                ok = np.isfinite(self.speed[:, io]) & np.isfinite(self.speed[:, ih]) & \
                    np.isfinite(self.memory_gb)
                if ih == io or ok.sum() < 5:
                    continue
                a = np.stack([np.ones(ok.sum()), lx[ok, io],
                              np.minimum(self.memory_gb[ok] / SLICE_MEMORY_GB[h], MAX_FILL)],
                             axis=1)
                out[(g, h)] = np.linalg.lstsq(a, lx[ok, ih], rcond=None)[0]
        return out

    def regress(self, measured: Mapping[int, float], memory_gb: float) -> np.ndarray:
        """(4,) speeds on VAR_SLICES from one measured slice and the job's memory need by
        :attr:`pairs`; NaN where no pair was fitted (no memory needs in the table)."""
        out = np.full(len(VAR_SLICES), np.nan)
        if len(measured) != 1 or not np.isfinite(memory_gb):
            return out
        (g, v), = measured.items()
        if g not in VAR_SLICES:
            return out
        lv = float(np.log(overhead(v)))
        for ih, h in enumerate(VAR_SLICES):
            c = self.pairs.get((g, h))
            if c is not None:
                fill = min(memory_gb / SLICE_MEMORY_GB[h], MAX_FILL)
                z = float(np.clip(c[0] + c[1] * lv + c[2] * fill, -40.0, 40.0))
                out[ih] = 1.0 / (1.0 + np.exp(z))
        out[VAR_SLICES.index(g)] = v
        return out

    def predict(self, feats: np.ndarray, measured: Mapping[int, float],
                transfer: str = "overhead") -> np.ndarray:
        """(4,) speeds on VAR_SLICES of a job with own features ``feats`` (5,) and one
        measured slice {g: speed}; NaN where no known workload has both slices. ``transfer``:
        one of TRANSFERS."""
        if transfer not in TRANSFERS:
            raise ValueError(f"transfer must be one of {TRANSFERS}, got {transfer!r}")
        out = np.full(len(VAR_SLICES), np.nan)
        if len(measured) != 1:
            return out
        (g, v), = measured.items()
        if g not in VAR_SLICES:
            return out
        io = VAR_SLICES.index(g)
        dist_f = np.linalg.norm(self.feats - np.asarray(feats)[None], axis=1)
        for ih, _ in enumerate(VAR_SLICES):
            ok = np.isfinite(self.speed[:, io]) & np.isfinite(self.speed[:, ih]) & \
                (self.speed[:, io] > 0)
            if ih == io or not ok.any():
                continue
            d = np.abs(self.speed[ok, io] - v) + MPS_WEIGHT * dist_f[ok]
            nn = np.argsort(d, kind="stable")[:K]
            sg, sh = self.speed[ok, io][nn], self.speed[ok, ih][nn]
            if transfer == "ratio":
                out[ih] = v * float(np.mean(sh / sg))
            else:
                r = float(np.exp(np.mean(np.log(overhead(sh) / overhead(sg)))))
                out[ih] = 1.0 / (1.0 + float(overhead(v)) * r)
        out[io] = v
        return out


def fit_curves(speeds: Mapping[str, Mapping[int, float]], feats: Mapping[str, np.ndarray],
               memory_gb: Mapping[str, float] | None = None) -> SliceCurves:
    """From each known workload's slice speeds {name: {slices: speed}}, the own-profile
    features of its columns {name: (c, 5)} (workloads in both only) and optionally their
    memory needs {name: GB} (NaN where missing)."""
    names = sorted(set(speeds) & set(feats))
    sp = np.array([[speeds[w].get(g, np.nan) for g in VAR_SLICES] for w in names])
    ft = np.array([np.asarray(feats[w], dtype=np.float64).mean(0) for w in names])
    mem = None if memory_gb is None else \
        np.array([float(memory_gb.get(w, np.nan)) for w in names], dtype=np.float64)
    return SliceCurves(sp.reshape(-1, len(VAR_SLICES)), ft.reshape(-1, 5), mem)


def blend(conditioned: np.ndarray, curves: SliceCurves | None, feats: np.ndarray | None,
          measured: Mapping[int, float], transfer: str = "overhead",
          shares: Mapping[int, float] | None = None, memory_gb: float | None = None
          ) -> np.ndarray:
    """Speeds on VAR_SLICES after one measured slice: ``shares[slice]`` (default BLEND) of the
    curves' estimate (``transfer``, see :meth:`SliceCurves.predict`) and the rest of the
    Gaussian-conditioned one (``conditioned``, (4,)), monotone around the measurement;
    unchanged without curves, features or exactly one measured slice. With the job's
    ``memory_gb`` and curves that hold memory needs, the mean of the three estimates
    (Gaussian, curves, :meth:`SliceCurves.regress`) instead, where all three exist."""
    measured = {g: min(float(v), 1.0) for g, v in measured.items() if g in VAR_SLICES}
    if curves is None or feats is None or len(measured) != 1 or \
            not np.isfinite(np.asarray(feats)).all():
        return conditioned
    w = (BLEND if shares is None else shares).get(next(iter(measured)), 0.0)
    if w <= 0:
        return conditioned
    k = curves.predict(feats, measured, transfer)
    m = np.where(np.isfinite(k), w * k + (1 - w) * conditioned, conditioned)
    if memory_gb is not None and np.isfinite(memory_gb) and memory_gb > 0:
        r = curves.regress(measured, float(memory_gb))
        three = (conditioned + k + r) / 3.0
        m = np.where(np.isfinite(three), three, m)
    (g, v), = measured.items()
    m[VAR_SLICES.index(g)] = v  # the measurement itself, exactly
    return monotone_fixed(m, np.isin(VAR_SLICES, list(measured)))
