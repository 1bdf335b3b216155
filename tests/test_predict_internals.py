"""Numpy U-Net equals the torch one."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the optional extra [train]

from miso.predict.model import UNet  # noqa: E402
from miso.predict.numpy_unet import NumpyEnsemble  # noqa: E402


def test_numpy_forward_matches_torch():
    models = []
    for s in range(2):
        torch.manual_seed(s)
        m = UNet(6)
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.data.uniform_(0.5, 1.5)
                mod.bias.data.uniform_(-0.2, 0.2)
        models.append(m.eval())
    x = np.random.default_rng(0).uniform(0.1, 1.0, size=(5, 3, 7)).astype(np.float32)
    with torch.no_grad():
        ref = np.stack([m(torch.from_numpy(x)).numpy() for m in models])
    ens = NumpyEnsemble([{k: v.numpy() for k, v in m.state_dict().items()} for m in models])
    np.testing.assert_allclose(ens(x), ref, atol=1e-5)


def test_unet_shape():
    assert UNet(4)(torch.rand(2, 3, 7)).shape == (2, 3, 7)


def test_grouped_ensemble_splits_into_equal_unets():
    """EnsembleUNet (grouped convs, one member per group) equals K separate UNets."""
    from miso.predict.model import EnsembleUNet

    torch.manual_seed(0)
    ens = EnsembleUNet(4, 3)
    for mod in ens.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 2.0)
            mod.bias.data.uniform_(-0.5, 0.5)
    ens.eval()
    x = torch.rand(5, 3, 3, 7)
    with torch.no_grad():
        y = ens(x)
        for i, sd in enumerate(ens.member_state_dicts()):
            m = UNet(4)
            m.load_state_dict(sd, strict=False)
            m.eval()
            np.testing.assert_allclose(m(x[:, i]).numpy(), y[:, i].numpy(), atol=1e-5)


def test_train_ensemble_members_differ_and_learn():
    from miso.predict.data import PairData
    from miso.predict.train import TrainConfig, predict_models, train_ensemble

    rng = np.random.default_rng(0)
    mps = rng.uniform(0.3, 1.0, size=(40, 3, 7)).astype(np.float32)
    mig = np.clip(mps[:, ::-1] * 0.8 + 0.1, 0.01, 1.0).astype(np.float32)
    d = PairData(mps, mig, np.arange(40))
    maes: list[float] = []
    cfg = TrainConfig(width=4, epochs=8, members=2, batch_size=16)
    models = train_ensemble(d, cfg, on_epoch=lambda e, mae: maes.append(mae))
    assert len(models) == 2
    w0, w1 = (m.state_dict()["enc1.0.weight"] for m in models)
    assert not torch.equal(w0, w1)
    # learning: the training error falls, and the trained members predict the pairs better
    # than members trained one epoch (same seeds)
    assert len(maes) == 8 and maes[-1] < 0.8 * maes[0], maes
    early = train_ensemble(d, TrainConfig(width=4, epochs=1, members=2, batch_size=16))

    def err(ms: list) -> float:
        return float(np.abs(predict_models(ms, mps, canonical=False) - mig[None]).mean())

    assert err(models) < err(early), (err(models), err(early))
