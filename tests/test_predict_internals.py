"""Numpy U-Net equals the torch one; MPS contention model behaviour."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the optional extra [train]

from miso.predict.model import UNet  # noqa: E402
from miso.predict.mps_model import DUMMY, mps_speed, params, synthesize_mps_speeds  # noqa: E402
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


# ------------------------------------------------------------------ mps_model
def test_synthesize_shapes_and_range():
    for n in range(1, 8):
        s = synthesize_mps_speeds(["resnet_train64"] * n)
        assert s.shape == (3, n)
        assert (s > 0).all() and (s <= 1.0 + 1e-9).all()


def test_synthesize_deterministic_without_rng_noisy_with():
    names = ["bert_train8", "gnn_train64"]
    np.testing.assert_array_equal(synthesize_mps_speeds(names), synthesize_mps_speeds(names))
    a = synthesize_mps_speeds(names, rng=np.random.default_rng(1))
    b = synthesize_mps_speeds(names, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, synthesize_mps_speeds(names))
    np.testing.assert_array_equal(
        synthesize_mps_speeds(names, rng=np.random.default_rng(1), noise=0.0),
        synthesize_mps_speeds(names),
    )


def test_alone_less_threads_not_faster():
    for name in ("bert_train8", "mobilenet_train64", "cyclegan_train4", "embedding_train64"):
        assert mps_speed(name, 100, []) == pytest.approx(1.0)
        v = [mps_speed(name, lv, []) for lv in (100, 50, 14)]
        assert v[0] >= v[1] >= v[2] > 0


def test_heavier_jobs_slow_down_more_on_fewer_threads():
    s = synthesize_mps_speeds(["bert_train8"])[:, 0]
    m = synthesize_mps_speeds(["mobilenet_train64"])[:, 0]
    assert s[2] / s[0] < m[2] / m[0]


def test_more_co_runners_not_faster():
    for lv in (100, 50, 14):
        prev = mps_speed("gnn_train128", lv, [])
        for k in range(1, 7):
            cur = mps_speed("gnn_train128", lv, ["transformer_train64"] * k)
            assert cur <= prev + 1e-12
            prev = cur


def test_consistency_between_functions():
    names = ["bert_train8", "gnn_train64", "resnet_train256"]
    s = synthesize_mps_speeds(names)
    other = ["bert_train8", "resnet_train256"]
    assert s[1, 1] == pytest.approx(mps_speed("gnn_train64", 50, other))


def test_errors_and_constants():
    with pytest.raises(KeyError):
        synthesize_mps_speeds(["no_such_job"])
    with pytest.raises(ValueError):
        synthesize_mps_speeds([])
    with pytest.raises(ValueError):
        mps_speed("bert_train8", 0, [])
    assert DUMMY.shape == (3,) and (DUMMY > 0).all()
    assert 0 < params().theta < 1


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
