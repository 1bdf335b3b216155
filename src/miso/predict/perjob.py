"""Per-job predictor: a job's own MPS profile and its co-runners' summary -> its 4g/3g speeds.

Why per job: the MIG target of a job does not depend on the mix (each job is measured alone on
MIG), only its MPS profile does. A model fed the whole mix (the U-Net) can key on which
workloads sit together, which does not carry over to a model it never saw; a model fed one job
at a time, with its co-runners reduced to mean/min/max per MPS level, generalises better to
unseen model families (benchmarks/README.md, "Predictor: unseen models").

Features per real job (padding columns are never inputs): log of its own normalised times at
100/50/14 %, its two log rate ratios, log mean/min/max of the other real jobs' times per level
(its own values when alone) and the number of real jobs. Model: an ensemble of small ReLU MLPs
(two hidden layers), trained here in numpy with Adam on the squared error plus L2, so neither
training nor inference needs torch. Outputs are speeds on 4g and 3g relative to the full GPU;
the networks learn them as log overheads, ``log(1/s - 1)`` (the extra time per iteration over the
full GPU's, floored at TARGET_FLOOR), which keeps every speed in (0, 1) and makes a given change
of input cost a given *ratio* of extra time: on leave-one-family-out 4g/3g speed_mae 0.0895 /
0.0825 against 0.0910 / 0.0860 with speed targets (mean of 3 seeds, benchmarks/README.md,
"Predictor, fourth pass").
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

from miso.predict.data import MAX_JOBS

#: Number of input features per job (see :func:`job_features`).
N_FEATURES = 15
#: Targets: "overhead" (log(1/s - 1), floored here) or "speed" (s itself, the first pass).
TARGETS = ("overhead", "speed")
TARGET_FLOOR = 0.02


def to_overhead(speed: np.ndarray) -> np.ndarray:
    """Speeds -> log overheads ``log(max(1/s - 1, TARGET_FLOOR))`` (s clipped to [0.01, 1])."""
    s = np.clip(np.asarray(speed, dtype=np.float64), 0.01, 1.0)
    return np.log(np.maximum(1.0 / s - 1.0, TARGET_FLOOR))


def from_overhead(z: np.ndarray) -> np.ndarray:
    """Log overheads -> speeds in (0, 1) (clipped so that no exp overflows)."""
    return 1.0 / (1.0 + np.exp(np.clip(np.asarray(z, dtype=np.float64), -40.0, 40.0)))


def job_features(mps: np.ndarray, real: np.ndarray) -> np.ndarray:
    """(N, 3, J) data-convention times and (N, J) real-job mask -> (N, J, 15) features.

    Rows of padding columns are filled but meaningless (callers select ``real``); co-runner
    statistics only ever use real jobs.
    """
    x = np.asarray(mps, dtype=np.float64).transpose(0, 2, 1)  # N, J, 3
    r = np.asarray(real, dtype=bool)
    n, j = r.shape
    lx = np.log(np.clip(x, 1e-6, 1.0))
    big = np.where(r[:, :, None], x, np.nan)
    others = np.where(~np.eye(j, dtype=bool)[None, :, :, None], big[:, None, :, :], np.nan)
    has = r.sum(1)[:, None] - r.astype(int) > 0  # N, J: some other real job in the mix
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slice: a job alone
        stats = [np.nanmean(others, 2), np.nanmin(others, 2), np.nanmax(others, 2)]
    stats = [np.where(has[:, :, None], s, x) for s in stats]
    cnt = np.broadcast_to(r.sum(1)[:, None, None].astype(np.float64), (n, j, 1))
    return np.concatenate(
        [lx, lx[..., :1] - lx[..., 1:], *(np.log(np.clip(s, 1e-6, 1.0)) for s in stats), cnt],
        axis=-1,
    )


@dataclass
class PerJobConfig:
    """Hyper-parameters (chosen on leave-one-family-out, benchmarks/README.md)."""

    hidden: int = 32
    members: int = 5
    epochs: int = 150
    lr: float = 3e-3
    batch_size: int = 200
    #: L2 penalty, as scikit-learn's MLP alpha: alpha / (2 n) * sum of squared weights.
    alpha: float = 0.1
    #: "l2" (squared error) or "l1" (absolute error)
    loss: str = "l2"
    seed: int = 0
    #: what the networks learn, one of TARGETS
    target: str = "overhead"

    def as_dict(self) -> dict:
        return asdict(self)


class PerJobModel:
    """Stacked weights of K MLPs F -> H -> H -> 2 plus the feature standardisation; the
    optional scalar ``overhead`` (1: outputs are log overheads, see :func:`to_overhead`; absent
    or 0: speeds, as models trained before it)."""

    NAMES = ("mu", "sd", "w1", "b1", "w2", "b2", "w3", "b3")

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        missing = [k for k in self.NAMES if k not in arrays]
        if missing:
            raise ValueError(f"per-job model lacks array(s) {', '.join(missing)}")
        self.a = {k: np.asarray(arrays[k], dtype=np.float64) for k in self.NAMES}
        if "overhead" in arrays:
            self.a["overhead"] = np.asarray(arrays["overhead"], dtype=np.float64).reshape(())
        self.overhead = bool(self.a.get("overhead", 0.0))
        if self.a["w1"].shape[1] != N_FEATURES:
            raise ValueError(f"per-job model takes {self.a['w1'].shape[1]} features, "
                             f"expected {N_FEATURES}")

    @property
    def k(self) -> int:
        return self.a["w1"].shape[0]

    def members(self, feats: np.ndarray) -> np.ndarray:
        """(n, F) -> (K, n, 2) speeds on 4g and 3g, one row per ensemble member."""
        a = self.a
        z = (np.asarray(feats, dtype=np.float64) - a["mu"]) / a["sd"]
        h = np.maximum(np.matmul(z[None], a["w1"]) + a["b1"], 0.0)
        h = np.maximum(np.matmul(h, a["w2"]) + a["b2"], 0.0)
        out = np.matmul(h, a["w3"]) + a["b3"]
        return from_overhead(out) if self.overhead else out

    def predict_mix(self, mps: np.ndarray, real: np.ndarray) -> np.ndarray:
        """(N, 3, J) times, (N, J) mask -> (K, N, J, 2) speeds; NaN on padding columns."""
        r = np.asarray(real, dtype=bool)
        f = job_features(mps, r)
        out = np.full((self.k, *r.shape, 2), np.nan)
        if r.any():
            out[:, r] = self.members(f[r])
        return out


def _adam_mlp(x: np.ndarray, y: np.ndarray, cfg: PerJobConfig) -> dict[str, np.ndarray]:
    """Train K MLPs at once (batched matmuls), each with its own init and shuffling."""
    k, h, n, f = cfg.members, cfg.hidden, len(x), x.shape[1]
    rng = np.random.default_rng(cfg.seed)
    shapes = {"w1": (f, h), "w2": (h, h), "w3": (h, y.shape[1])}
    p: dict[str, np.ndarray] = {}
    for name, (a, b) in shapes.items():
        bound = np.sqrt(6.0 / (a + b))
        p[name] = rng.uniform(-bound, bound, size=(k, a, b))
        p["b" + name[1]] = rng.uniform(-bound, bound, size=(k, 1, b))
    m = {q: np.zeros_like(v) for q, v in p.items()}
    v2 = {q: np.zeros_like(v) for q, v in p.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    bs = min(cfg.batch_size, n)
    steps = max(1, n // bs)
    t = 0
    lam = cfg.alpha / n
    for _ in range(cfg.epochs):
        order = np.argsort(rng.random((k, n)), axis=1)
        for s in range(steps):
            idx = order[:, s * bs : (s + 1) * bs]  # K, B
            xb, yb = x[idx], y[idx]  # K, B, F / K, B, 2
            z1 = np.matmul(xb, p["w1"]) + p["b1"]
            a1 = np.maximum(z1, 0.0)
            z2 = np.matmul(a1, p["w2"]) + p["b2"]
            a2 = np.maximum(z2, 0.0)
            out = np.matmul(a2, p["w3"]) + p["b3"]
            diff = out - yb
            g_out = (np.sign(diff) if cfg.loss == "l1" else diff) / (bs * y.shape[1])
            grads = {"w3": np.matmul(a2.transpose(0, 2, 1), g_out) + lam * p["w3"],
                     "b3": g_out.sum(1, keepdims=True)}
            g2 = np.matmul(g_out, p["w3"].transpose(0, 2, 1)) * (z2 > 0)
            grads["w2"] = np.matmul(a1.transpose(0, 2, 1), g2) + lam * p["w2"]
            grads["b2"] = g2.sum(1, keepdims=True)
            g1 = np.matmul(g2, p["w2"].transpose(0, 2, 1)) * (z1 > 0)
            grads["w1"] = np.matmul(xb.transpose(0, 2, 1), g1) + lam * p["w1"]
            grads["b1"] = g1.sum(1, keepdims=True)
            t += 1
            for q, g in grads.items():
                m[q] = b1 * m[q] + (1 - b1) * g
                v2[q] = b2 * v2[q] + (1 - b2) * g * g
                mh = m[q] / (1 - b1**t)
                vh = v2[q] / (1 - b2**t)
                p[q] -= cfg.lr * mh / (np.sqrt(vh) + eps)
    return p


def training_rows(mps: np.ndarray, mig: np.ndarray, real: np.ndarray) -> tuple[np.ndarray,
                                                                                np.ndarray]:
    """Features (n, F) and targets (n, 2) = speeds (t7/t4, t7/t3) of every real column."""
    f = job_features(mps, real)[real]
    mg = np.asarray(mig, dtype=np.float64).transpose(0, 2, 1)[real]  # n, 3
    return f, np.stack([mg[:, 0] / mg[:, 1], mg[:, 0] / mg[:, 2]], axis=1)


def fit_perjob(mps: np.ndarray, mig: np.ndarray, real: np.ndarray,
               cfg: PerJobConfig | None = None) -> PerJobModel:
    """Train on the real columns of (N, 3, 7) pairs; deterministic for a given ``cfg.seed``."""
    cfg = cfg or PerJobConfig()
    if cfg.loss not in ("l1", "l2"):
        raise ValueError(f"loss must be l1 or l2, got {cfg.loss!r}")
    if cfg.target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {cfg.target!r}")
    if np.asarray(mps).shape[-1] != MAX_JOBS or not np.asarray(real).any():
        raise ValueError("fit_perjob needs (N, 3, 7) pairs with at least one real column")
    f, y = training_rows(mps, mig, real)
    mu = f.mean(0)
    sd = f.std(0) + 1e-9
    ov = cfg.target == "overhead"
    p = _adam_mlp((f - mu) / sd, to_overhead(y) if ov else y, cfg)
    return PerJobModel({"mu": mu, "sd": sd, **p, "overhead": np.array(float(ov))})
