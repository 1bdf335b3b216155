"""MPS-to-MIG performance predictor (per-job model; the MISO U-Net).

Quick use::

    from miso.predict import Predictor
    pred = Predictor.load()                      # shipped weights, loaded once
    out = pred.predict(raw_mps_speeds)           # (3, n) iterations/s at MPS 100/50/14 %
    out.by_slices()                              # [{7: 1.0, 4: .., 3: .., 2: .., 1: ..}, ...]
    out.by_profile()                             # [{"7g.40gb": 1.0, ...}, ...]
    out.intervals()                              # [{4: (speed, lo, hi), ...}, ...] (95 %)
    pred.predict_jobs([JobEvidence(mps={100: r100, 14: r14}, slices={4: 0.81})])

See :mod:`miso.predict.predictor` for conventions; the MPS speeds the simulator and the emulated
backend run at (and profile) come from :mod:`miso.mps_speed`.
"""

from miso.predict.data import (
    DUMMY,
    MAX_JOBS,
    MPS_LEVELS,
    SLICES,
    DataError,
    pad_mix,
    speeds_to_normalised,
)
from miso.predict.evidence import JobEvidence
from miso.predict.prediction import A100_40GB_PROFILES, Prediction, Profile, map_to_profiles
from miso.predict.predictor import Predictor

__all__ = [
    "A100_40GB_PROFILES",
    "DUMMY",
    "MAX_JOBS",
    "MPS_LEVELS",
    "SLICES",
    "DataError",
    "JobEvidence",
    "Prediction",
    "Predictor",
    "Profile",
    "map_to_profiles",
    "pad_mix",
    "speeds_to_normalised",
]
