"""Data conventions of the MPS-to-MIG predictor, loading, validation and workload identification.

Orientation (checked against ``mig_speed_a100_40gb.csv``)
-------------------------------------------------------
The MISO training file stores, for every job (column), per-iteration *time* normalised by the
column's maximum, so values lie in (0, 1] and the largest value is the slowest setting:

* ``mig[:, 0, j] = t7/tmax``, ``mig[:, 1, j] = t4/tmax``, ``mig[:, 2, j] = t3/tmax``; for the 31
  real workloads the column matches ``mean_iter_time_s`` of the CSV divided by its max to within
  0.007 (e.g. ``bert_train8``: CSV times 0.1207/0.2104/0.2335 s -> 0.517/0.901/1.0, file
  0.5169/0.9011/1.0). So **speed relative to the full GPU on slice g = mig[0] / mig[g]**
  (3g of bert_train8: 0.517 = CSV ``speed_vs_7g``).
* ``mps[:, k, j]`` = time of job j at MPS level k (100/50/14 % active threads) / max over levels.
  From raw per-level throughputs ``s[k]`` (any unit per job) the same numbers are
  ``min(s) / s[k]``: :func:`speeds_to_normalised`.

The rest of miso only sees speeds relative to the full GPU; the conversion happens at the
predictor's boundary (:mod:`miso.predict.predictor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Rows of the MPS input: active-thread percentages.
MPS_LEVELS: tuple[int, ...] = (100, 50, 14)
#: Rows of the MIG output of the network: compute slices (7g.40gb, 4g.20gb, 3g.20gb).
NET_SLICES: tuple[int, ...] = (7, 4, 3)
#: Compute-slice counts of the predictor's public output, largest first.
SLICES: tuple[int, ...] = (7, 4, 3, 2, 1)
#: Jobs per mix the network takes.
MAX_JOBS = 7

#: MIG column of the light dummy job used by the data set to pad mixes of < 7 jobs
#: (constant in every sample: t7/t4/t3 = 8/9, 1, 8/9).
DUMMY_MIG = np.array([8 / 9, 1.0, 8 / 9], dtype=np.float32)
#: MPS profile used to pad mixes of fewer than 7 jobs (the dummy job's modal measured profile:
#: equal time at the three levels; it is the most frequent dummy column of the data set and the
#: predictor is trained with dummy columns replaced by it half of the time).
DUMMY = np.array([1.0, 1.0, 1.0], dtype=np.float32)


class DataError(ValueError):
    """Input that does not follow the data convention; the message is one line."""


def validate_normalised(arr: np.ndarray, name: str = "mps", allow_cols: bool = True) -> np.ndarray:
    """Check a (3, n) / (N, 3, 7) array of normalised values in (0, 1]; return float32 copy."""
    a = np.asarray(arr, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise DataError(f"{name}: contains NaN or infinite values")
    if a.size and (a.min() <= 0.0 or a.max() > 1.0 + 1e-6):
        raise DataError(
            f"{name}: values must lie in (0, 1] (got min {a.min():.4g}, max {a.max():.4g})"
        )
    return np.minimum(a, 1.0).astype(np.float32)


def speeds_to_normalised(speeds: np.ndarray) -> np.ndarray:
    """Raw per-level speeds (3, n), any positive unit per job -> data convention min(s)/s."""
    s = np.asarray(speeds, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != 3:
        raise DataError(f"expected raw MPS speeds of shape (3, n_jobs), got {s.shape}")
    if not np.all(np.isfinite(s)):
        raise DataError("raw MPS speeds contain NaN or infinite values")
    if np.any(s <= 0):
        raise DataError("raw MPS speeds must be positive")
    return (s.min(axis=0, keepdims=True) / s).astype(np.float32)


def pad_mix(norm: np.ndarray) -> np.ndarray:
    """Pad a normalised (3, n) MPS profile, n <= 7, to (3, 7) with the :data:`DUMMY` profile."""
    a = np.asarray(norm, dtype=np.float32)
    if a.ndim != 2 or a.shape[0] != 3:
        raise DataError(f"expected an MPS profile of shape (3, n_jobs), got {a.shape}")
    n = a.shape[1]
    if n < 1 or n > MAX_JOBS:
        raise DataError(f"a mix has 1..{MAX_JOBS} jobs, got {n}")
    out = np.repeat(DUMMY[:, None], MAX_JOBS, axis=1)
    out[:, :n] = a
    return out


@dataclass
class PairData:
    """The arrays of an ``mps_mig_pairs``-style file."""

    mps: np.ndarray  # (N, 3, 7) float32
    mig: np.ndarray  # (N, 3, 7) float32
    mix_id: np.ndarray  # (N,) int; synthetic per-sample ids when absent

    def __len__(self) -> int:
        return len(self.mps)

    def subset(self, idx: np.ndarray) -> PairData:
        return PairData(self.mps[idx], self.mig[idx], self.mix_id[idx])


def load_pairs(path: str | Path) -> PairData:
    """Load and validate a file with arrays ``mps`` and ``mig`` of shape (N, 3, 7)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    try:
        with np.load(p, allow_pickle=False) as z:
            files = set(z.files)
            missing = {"mps", "mig"} - files
            if missing:
                raise DataError(f"{p}: missing array(s) {', '.join(sorted(missing))}")
            mps = np.asarray(z["mps"])
            mig = np.asarray(z["mig"])
            mix = np.asarray(z["mix_id"]) if "mix_id" in files else None
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets a one-line error
        raise DataError(f"{p}: cannot read as .npz ({type(exc).__name__})") from None
    for name, a in (("mps", mps), ("mig", mig)):
        if a.dtype.kind not in "iuf":
            raise DataError(f"{p}: array {name} holds {a.dtype} values, not numbers")
        if a.ndim != 3 or a.shape[1:] != (3, MAX_JOBS):
            raise DataError(f"{name}: expected shape (N, 3, 7), got {tuple(a.shape)}")
    if mps.shape[0] != mig.shape[0]:
        raise DataError(f"mps has {mps.shape[0]} samples but mig has {mig.shape[0]}")
    if mps.shape[0] == 0:
        raise DataError("file holds no samples")
    mps = validate_normalised(mps, "mps")
    mig = validate_normalised(mig, "mig")
    if mix is None or mix.shape != (mps.shape[0],):
        mix = np.arange(mps.shape[0])
    elif mix.dtype.kind not in "iu":  # any labels group samples (strings, floats)
        mix = np.unique(mix, return_inverse=True)[1]
    return PairData(mps, mig, mix.astype(np.int64))


def canonical_order(mps: np.ndarray) -> np.ndarray:
    """Column order (..., 7) that sorts each mix by its jobs' MPS profile.

    The U-Net is not permutation-equivariant, the task is: feeding columns in a canonical order
    (by t100 - t14, then t50) makes predictions independent of the order jobs are given in.
    """
    a = np.asarray(mps, dtype=np.float64)
    key = (a[..., 0, :] - a[..., 2, :]) * 4.0 + a[..., 1, :] * 1e-3
    return np.argsort(key, axis=-1, kind="stable")


def dummy_columns(mig: np.ndarray, tol: float = 2e-3) -> np.ndarray:
    """Boolean (N, 7): which columns are the padding dummy (identified by its MIG column)."""
    return np.all(np.abs(np.asarray(mig) - DUMMY_MIG[None, :, None]) < tol, axis=1)


def grouped_split(
    mix_id: np.ndarray, val_frac: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Train/validation sample indices with every mix entirely on one side."""
    mixes = np.unique(mix_id)
    rng = np.random.default_rng(seed)
    val_mixes = rng.choice(mixes, size=max(1, round(val_frac * len(mixes))), replace=False)
    is_val = np.isin(mix_id, val_mixes)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def catalogue_mig_columns() -> tuple[list[str], np.ndarray]:
    """Per-workload (t7, t4, t3)/max from the shipped CSV, for workloads measured on all three."""
    import csv
    from importlib import resources

    text = resources.files("miso.data").joinpath("mig_speed_a100_40gb.csv").read_text()
    times: dict[str, dict[int, float]] = {}
    for row in csv.DictReader(text.splitlines()):
        t = row["mean_iter_time_s"].strip()
        if t:
            times.setdefault(row["workload"], {})[int(row["slice"].split("g", 1)[0])] = float(t)
    names = sorted(w for w, t in times.items() if all(g in t for g in NET_SLICES))
    ref = np.array([[times[w][g] for g in NET_SLICES] for w in names])
    return names, ref / ref.max(axis=1, keepdims=True)


def identify_workloads(mig: np.ndarray, tol: float = 0.01) -> tuple[np.ndarray, list[str]]:
    """Label every column of ``mig`` (N, 3, 7) with a workload index.

    Each distinct MIG column of the file is matched to the CSV workload (or the dummy) whose
    (t7, t4, t3)/max triple is nearest in max-abs distance; a column farther than ``tol`` from
    every workload gets -1. Returns labels (N, 7) and the names (last name is ``"DUMMY"``).
    """
    names, ref = catalogue_mig_columns()
    names = [*names, "DUMMY"]
    ref = np.vstack([ref, DUMMY_MIG[None].astype(np.float64)])
    cols = np.asarray(mig, dtype=np.float64).transpose(0, 2, 1)  # N, 7, 3
    uniq, inv = np.unique(np.round(cols.reshape(-1, 3), 4), axis=0, return_inverse=True)
    dist = np.abs(uniq[:, None, :] - ref[None]).max(-1)
    best = dist.argmin(1)
    best[dist.min(1) > tol] = -1
    return best[inv.reshape(-1)].reshape(cols.shape[:2]), names
