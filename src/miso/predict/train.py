"""Training of the U-Net ensemble (MAE loss, Adam, one-cycle schedule), deterministic per seed."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from miso.predict.data import DUMMY, PairData, canonical_order, dummy_columns
from miso.predict.model import UNet


@dataclass
class TrainConfig:
    """Hyper-parameters (defaults chosen by the search in ``benchmarks/README.md``)."""

    width: int = 16
    epochs: int = 40
    lr: float = 1e-2
    batch_size: int = 64
    weight_decay: float = 0.0
    #: probability that a sample's dummy MPS columns are replaced by :data:`DUMMY` (what the API
    #: pads with), so the net serves both measured and API-padded inputs.
    dummy_replace: float = 0.5
    #: random column permutation of each training sample (the task is permutation-equivariant).
    permute: bool = True
    members: int = 4
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
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(threads or min(2, os.cpu_count() or 1))


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


def train_member(
    data: PairData,
    cfg: TrainConfig,
    seed: int,
    on_epoch: Callable[[int, float], None] | None = None,
) -> UNet:
    """Train one U-Net on ``data``; ``on_epoch(epoch, train_mae)`` is called after each epoch."""
    set_determinism(seed)
    rng = np.random.default_rng(seed)
    if cfg.unique_mixes:
        data = data.subset(np.unique(data.mix_id, return_index=True)[1])
    model = UNet(cfg.width)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    n = len(data)
    steps = max(1, (n + cfg.batch_size - 1) // cfg.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.lr, total_steps=cfg.epochs * steps, pct_start=0.2
    )
    dmask = dummy_columns(data.mig)
    model.train()
    for epoch in range(cfg.epochs):
        x_all, y_all = _augment(data.mps, data.mig, dmask, cfg, rng)
        order = rng.permutation(n)
        total = 0.0
        for s in range(steps):
            idx = order[s * cfg.batch_size : (s + 1) * cfg.batch_size]
            if len(idx) < 2:  # batch norm needs two samples
                continue
            xb = torch.from_numpy(x_all[idx])
            yb = torch.from_numpy(y_all[idx])
            loss = (model(xb) - yb).abs().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        if on_epoch is not None:
            on_epoch(epoch, total / n)
    model.eval()
    return model


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
