"""MPS profiles for ``predictor="unet"`` runs (the predictor itself is loaded by
:func:`miso.sched.estimators.load_predictor`).

The simulator then measures MPS profiles with the predictor package's synthetic MPS model
(:func:`miso.predict.mps_model.synthesize_mps_speeds`) and MISO estimates speeds with the real
U-Net ensemble on those profiles, so the error is the predictor's (plus the MPS model's)
instead of an injected Gaussian.
"""

from __future__ import annotations

import numpy as np


def synthetic_mps(workloads: list[str], rng: np.random.Generator) -> list[tuple[float, ...]]:
    """MPS speeds (relative to alone on the full GPU) at 100/50/14 % for a mix."""
    from miso.predict.mps_model import synthesize_mps_speeds

    s = synthesize_mps_speeds(list(workloads), rng)
    return [tuple(float(x) for x in s[:, i]) for i in range(s.shape[1])]
