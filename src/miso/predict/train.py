"""Training of the U-Net ensemble (MAE loss, Adam, one-cycle schedule), deterministic per seed."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from miso.predict.data import DUMMY, PairData, canonical_order, dummy_columns
from miso.predict.model import EnsembleUNet, UNet


@dataclass
class TrainConfig:
    """Hyper-parameters (defaults chosen by the search in ``benchmarks/README.md``)."""

    width: int = 16
    epochs: int = 60
    lr: float = 1e-2
    batch_size: int = 64
    weight_decay: float = 0.0
    #: probability that a sample's dummy MPS columns are replaced by :data:`DUMMY` (what the API
    #: pads with), so the net serves both measured and API-padded inputs.
    dummy_replace: float = 0.5
    #: random column permutation of each training sample (the task is permutation-equivariant).
    permute: bool = True
    members: int = 3
    #: learning-rate schedule: "onecycle" (warm-up then cosine decay) or "cosine" (decay only).
    schedule: str = "onecycle"
    #: feed columns in :func:`canonical_order` (makes the net permutation-equivariant).
    canonical: bool = True
    #: train on one sample per mix (the file repeats every mix with permuted columns).
    unique_mixes: bool = True
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def set_determinism(seed: int, threads: int | None = None) -> None:
    """Seed every RNG and make torch deterministic on CPU."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # CPU kernels of this network are deterministic for a fixed thread count (checked: two runs
    # give bit-identical weights); torch's deterministic mode only slows them down (~1.6x).
    env = os.environ.get("MISO_TRAIN_THREADS", "")
    torch.set_num_threads(threads or (int(env) if env.isdigit() else min(2, os.cpu_count() or 1)))


def _augment(
    mps: np.ndarray, mig: np.ndarray, dmask: np.ndarray, cfg: TrainConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    x = mps.copy()
    y = mig
    if cfg.dummy_replace > 0:
        rep = (rng.random(len(x)) < cfg.dummy_replace)[:, None] & dmask
        x = np.where(rep[:, None, :], DUMMY[None, :, None], x)
    if cfg.canonical:
        perm = canonical_order(x)
        x = np.take_along_axis(x, perm[:, None, :], axis=2)
        y = np.take_along_axis(y, perm[:, None, :], axis=2)
    elif cfg.permute:
        perm = np.argsort(rng.random((len(x), x.shape[2])), axis=1)
        x = np.take_along_axis(x, perm[:, None, :], axis=2)
        y = np.take_along_axis(y, perm[:, None, :], axis=2)
    return x, y


def _scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig, total: int):
    if cfg.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    if cfg.schedule != "onecycle":
        raise ValueError(f"unknown schedule {cfg.schedule!r} (onecycle or cosine)")
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=total, pct_start=0.2)


def train_ensemble(
    data: PairData,
    cfg: TrainConfig,
    seed: int | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> list[UNet]:
    """Train ``cfg.members`` U-Nets at once (one grouped network, one pass per step).

    Every member has its own initialisation, its own shuffling and its own dummy substitution
    (rng seeded ``seed * 1000 + k``), exactly as if trained alone, but the K small networks share
    each forward/backward call, so K members cost little more wall time than one on a CPU.
    ``on_epoch(epoch, mean train MAE over members)`` is called after each epoch.
    """
    seed = cfg.seed if seed is None else seed
    k = cfg.members
    set_determinism(seed)
    rngs = [np.random.default_rng(seed * 1000 + i) for i in range(k)]
    if cfg.unique_mixes:
        data = data.subset(np.unique(data.mix_id, return_index=True)[1])
    net = EnsembleUNet(cfg.width, k)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    n = len(data)
    steps = max(1, (n + cfg.batch_size - 1) // cfg.batch_size)
    sched = _scheduler(opt, cfg, cfg.epochs * steps)
    dmask = dummy_columns(data.mig)
    net.train()
    for epoch in range(cfg.epochs):
        aug = [_augment(data.mps, data.mig, dmask, cfg, r) for r in rngs]
        orders = [r.permutation(n) for r in rngs]
        x_all = np.stack([a[0] for a in aug], axis=1)  # n, K, 3, 7
        y_all = np.stack([a[1] for a in aug], axis=1)
        ar = np.arange(k)[None, :]
        total = 0.0
        for s in range(steps):
            idx = np.stack([o[s * cfg.batch_size : (s + 1) * cfg.batch_size] for o in orders], 1)
            if len(idx) < 2:  # batch norm needs two samples
                continue
            xb = torch.from_numpy(x_all[idx, ar])
            yb = torch.from_numpy(y_all[idx, ar])
            loss = (net(xb) - yb).abs().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        if on_epoch is not None:
            on_epoch(epoch, total / n)
    net.eval()
    models = []
    for sd in net.member_state_dicts():
        m = UNet(cfg.width)
        m.load_state_dict(sd, strict=False)
        m.eval()
        models.append(m)
    return models


@torch.no_grad()
def predict_models(
    models: list[UNet], mps: np.ndarray, canonical: bool = True, batch: int = 4096
) -> np.ndarray:
    """Stacked predictions (members, N, 3, 7) in the data convention, in the input's order."""
    mps = np.asarray(mps, dtype=np.float32)
    if canonical:
        perm = canonical_order(mps)
        mps = np.take_along_axis(mps, perm[:, None, :], axis=2)
    x = torch.from_numpy(np.ascontiguousarray(mps))
    out = []
    for m in models:
        m.eval()
        out.append(torch.cat([m(x[i : i + batch]) for i in range(0, len(x), batch)]).numpy())
    res = np.stack(out)
    if canonical:
        inv = np.argsort(perm, axis=1)
        res = np.take_along_axis(res, inv[None, :, None, :], axis=3)
    return res
