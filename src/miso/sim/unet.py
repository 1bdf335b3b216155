"""Adapters to the learned predictor (:mod:`miso.predict`) for ``predictor="unet"`` runs.

The simulator then measures MPS profiles with the predictor package's synthetic MPS model
(:func:`miso.predict.mps_model.synthesize_mps_speeds`) and MISO estimates speeds with the real
U-Net ensemble on those profiles, so the error is the predictor's (plus the MPS model's)
instead of an injected Gaussian.
"""

from __future__ import annotations

from functools import cache

import numpy as np


@cache
def _predictor():  # noqa: ANN202
    from miso.predict.predictor import Predictor

    return Predictor.load()


def unet_predictor():  # noqa: ANN201
    """The shipped predictor (``predict(raw (3, n))``: speeds and their uncertainty on
    7/4/3/2/1 slices), as :class:`miso.sched.PredictorEstimator` takes it."""
    return _predictor()


def synthetic_mps(workloads: list[str], rng: np.random.Generator) -> list[tuple[float, ...]]:
    """MPS speeds (relative to alone on the full GPU) at 100/50/14 % for a mix."""
    from miso.predict.mps_model import synthesize_mps_speeds

    s = synthesize_mps_speeds(list(workloads), rng)
    return [tuple(float(x) for x in s[:, i]) for i in range(s.shape[1])]
