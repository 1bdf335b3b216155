"""Tests of the MPS-to-MIG predictor (miso.predict) and its CLI; fast, no full training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from miso.cli.predictor import app
from miso.mps_speed import measured_profile
from miso.predict import (
    A100_40GB_PROFILES,
    DUMMY,
    SLICES,
    DataError,
    Predictor,
    map_to_profiles,
    pad_mix,
    speeds_to_normalised,
)
from miso.predict.data import catalogue_mig_columns, identify_workloads
from miso.predict.lowslice import fit_lowslice

#: the first 1,000 rows of the MISO A100 MPS/MIG pairs (tests/data/README.md)
SHARED = Path(__file__).parent / "data" / "mps_mig_sample.npz"
runner = CliRunner()


@pytest.fixture(scope="module")
def pred() -> Predictor:
    return Predictor.load()


def synthetic_pairs(n_mixes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A small mps/mig file in the data convention, built from the catalogue + miso.mps_speed."""
    names, ref = catalogue_mig_columns()
    rng = np.random.default_rng(seed)
    mps, mig, mix = [], [], []
    for m in range(n_mixes):
        idx = rng.choice(len(names), size=7)
        s = measured_profile([names[i] for i in idx], rng=rng)
        mps.append(speeds_to_normalised(s))
        mig.append(ref[idx].T)
        mix.append(m)
    return {
        "mps": np.array(mps, dtype=np.float32),
        "mig": np.array(mig, dtype=np.float32),
        "mix_id": np.array(mix, dtype=np.int32),
    }


# ------------------------------------------------------------------ conventions and padding
def test_speeds_to_normalised_is_time_over_max():
    s = np.array([[10.0, 2.0], [5.0, 4.0], [2.0, 4.0]])
    n = speeds_to_normalised(s)
    np.testing.assert_allclose(n[:, 0], [0.2, 0.4, 1.0])
    np.testing.assert_allclose(n[:, 1], [1.0, 0.5, 0.5])


def test_pad_mix_uses_dummy_never_zeros():
    for n in range(1, 8):
        x = np.full((3, n), 0.5, dtype=np.float32)
        p = pad_mix(x)
        assert p.shape == (3, 7)
        assert (p > 0).all()
        np.testing.assert_array_equal(p[:, n:], np.repeat(DUMMY[:, None], 7 - n, axis=1))


def test_orientation_matches_csv():
    """The file's MIG rows are time/max: mig[0]/mig[2] equals the CSV 3g speed."""
    names, ref = catalogue_mig_columns()
    from miso.workloads import workload

    for name, col in zip(names, ref, strict=True):
        assert col[0] / col[2] == pytest.approx(min(1.0, workload(name).speed(3)), abs=0.01)


def test_identify_workloads_on_shared_data():
    with np.load(SHARED) as z:
        mig = z["mig"][:500]
    lab, names = identify_workloads(mig)
    assert (lab >= 0).all() and names[-1] == "DUMMY"


# ------------------------------------------------------------------ shipped model
def test_shipped_model_shapes_for_1_to_7_jobs(pred):
    rng = np.random.default_rng(1)
    for n in range(1, 8):
        out = pred.predict(rng.uniform(0.2, 1.0, size=(3, n)))
        assert out.speed.shape == (n, 5) and out.std.shape == (n, 5)
        for d in out.by_slices():
            assert set(d) == set(SLICES)
            assert d[7] == 1.0
            vals = [d[g] for g in SLICES]
            assert all(0 < v <= 1 for v in vals)
            assert vals == sorted(vals, reverse=True)
        assert set(out.by_profile()[0]) == {p[0] for p in A100_40GB_PROFILES}


def test_padding_is_done_by_the_api(pred):
    x = np.array([[0.5, 1.0], [0.7, 0.8], [1.0, 0.6]], dtype=np.float32)
    a = pred.predict_normalised(x)
    # the file path (evaluation) pads as the live API does: same speeds for the real jobs
    real = np.arange(7)[None] < 2
    b = pred.live_speeds(pad_mix(x)[None], real)
    np.testing.assert_allclose(a.speed, b.speed, rtol=1e-6)


def test_raw_speed_units_do_not_matter(pred):
    s = measured_profile(["bert_train8", "mobilenet_train64", "gnn_train128"])
    a = pred.predict(s)
    b = pred.predict(s * np.array([[3.0, 100.0, 0.01]]))
    np.testing.assert_allclose(a.speed, b.speed, rtol=1e-6)


def test_order_of_jobs_does_not_matter(pred):
    s = measured_profile(["bert_train8", "mobilenet_train64", "gnn_train128"])
    a = pred.predict(s)
    b = pred.predict(s[:, ::-1])
    np.testing.assert_allclose(a.speed, b.speed[::-1], rtol=1e-6)


def test_job_slow_on_3g_gets_lower_3g_speed(pred):
    # bert_train8: 3g speed 0.52; mobilenet_train64: 0.97 (CSV)
    s = measured_profile(["bert_train8", "mobilenet_train64"])
    out = pred.predict(s).by_slices()
    assert out[0][3] < out[1][3]
    assert out[0][4] < out[1][4]


def test_shipped_model_fits_the_data(pred):
    with np.load(SHARED) as z:
        mps, mig = z["mps"][:1000], z["mig"][:1000]
    from miso.predict.data import dummy_columns

    real = ~dummy_columns(mig)
    assert np.abs(pred.predict_mig_normalised(mps, real=real) - mig).mean() < 0.03


def test_memory_limits_and_profiles(pred):
    s = measured_profile(["bert_train8", "mobilenet_train64"])
    out = pred.predict(s, memory_gb=[10.2, 3.0])
    d = out.by_slices()
    assert d[0][2] is None and d[0][1] is None and d[0][3] is not None
    assert all(d[1][g] is not None for g in SLICES)
    prof = out.by_profile()
    assert prof[0]["2g.10gb"] is None and prof[0]["3g.20gb"] is not None
    h100 = [("7g.80gb", 7, 79.0), ("3g.40gb", 3, 39.0), ("1g.10gb", 1, 9.75)]
    ph = out.by_profile(h100)
    assert ph[0]["1g.10gb"] is None and ph[1]["1g.10gb"] is not None
    assert map_to_profiles({7: 1.0, 4: 0.8, 3: 0.7}, [("x", 5, 1.0)])["x"] == pytest.approx(
        0.8 + (1.0 - 0.8) / 3
    )


# ------------------------------------------------------------------ error paths
@pytest.mark.parametrize(
    "bad",
    [
        np.ones((2, 3)),
        np.ones((3, 8)),
        np.ones((3, 0)),
        np.ones(7),
        np.array([[1.0, np.nan], [1.0, 1.0], [1.0, 1.0]]),
        np.array([[1.0, -1.0], [1.0, 1.0], [1.0, 1.0]]),
    ],
)
def test_bad_raw_inputs(pred, bad):
    with pytest.raises(DataError):
        pred.predict(bad)


@pytest.mark.parametrize(
    "bad",
    [np.full((3, 2), 1.5), np.zeros((3, 2)), np.full((3, 2), np.nan), np.ones((4, 2))],
)
def test_bad_normalised_inputs(pred, bad):
    with pytest.raises(DataError):
        pred.predict_normalised(bad)


def test_memory_list_length_checked(pred):
    with pytest.raises(DataError):
        pred.predict(np.ones((3, 2)), memory_gb=[1.0])


# ------------------------------------------------------------------ uncertainty, correction
def test_uncertainty_present(pred):
    out = pred.predict(measured_profile(["bert_train8", "resnet_train64", "gnn_train64"]))
    assert (out.std >= 0).all()
    assert (out.std[:, 0] == 0).all()
    assert (out.std[:, 3:] > 0).all()  # 2g/1g include the linear model's residual
    assert len(out.std_by_slices()) == 3


def test_online_correction(pred):
    out = pred.predict(measured_profile(["bert_train8", "resnet_train64"]))
    before = out.speed[0].copy()
    obs3 = before[2] * 0.8
    c = pred.correct(out, 0, {3: obs3})
    assert c.speed[0, 2] == pytest.approx(obs3)
    assert c.std[0, 2] == 0 and c.observed[0, 2]
    assert c.speed[0, 1] <= before[1] + 1e-12  # neighbours move the same way
    assert c.speed[0, 3] < before[3]
    assert c.speed[0, 0] == 1.0
    assert (np.diff(c.speed[0]) <= 1e-12).all()  # still monotone
    np.testing.assert_array_equal(c.speed[1], out.speed[1])  # other jobs untouched
    np.testing.assert_array_equal(out.speed[0], before)  # input not mutated
    # faster than predicted on 1g: bigger slices can't be slower than the observation
    c2 = pred.correct(out, 0, {1: min(1.0, before[1] + 0.05)})
    assert (c2.speed[0, :4] >= c2.speed[0, 4] - 1e-12).all()
    with pytest.raises(DataError):
        pred.correct(out, 5, {3: 0.5})
    with pytest.raises(DataError):
        pred.correct(out, 0, {5: 0.5})


# ------------------------------------------------------------------ 2g/1g linear model
def test_lowslice_model_quality():
    m = fit_lowslice()
    assert m.r2[2] > 0.9 and m.mae[2] < 0.05
    assert m.r2[1] > 0.7
    low = m.predict(np.array([0.9]), np.array([0.8]))
    assert 0 < low[1][0] <= low[2][0] <= 0.8


# ------------------------------------------------------------------ CLI
def test_cli_eval_json(tmp_path):
    f = tmp_path / "d.npz"
    np.savez(f, **synthetic_pairs(10))
    r = runner.invoke(app, ["eval", "--data", str(f), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["samples"] == 10 and 0 <= res["mae"] < 1


@pytest.mark.parametrize("kind", ["shape", "nan", "range", "missing", "notnpz"])
def test_cli_eval_errors(tmp_path, kind):
    f = tmp_path / "bad.npz"
    d = synthetic_pairs(3)
    if kind == "shape":
        d["mps"] = d["mps"][:, :, :6]
    elif kind == "nan":
        d["mig"][0, 0, 0] = np.nan
    elif kind == "range":
        d["mps"][0, 0, 0] = 1.5
    elif kind == "missing":
        del d["mig"]
    if kind == "notnpz":
        f.write_text("hello")
    else:
        np.savez(f, **d)
    r = runner.invoke(app, ["eval", "--data", str(f)])
    assert r.exit_code != 0
    assert "Traceback" not in r.output
    assert r.output.strip().startswith("error:") and len(r.output.strip().splitlines()) == 1


def test_cli_train_is_deterministic(tmp_path):
    pytest.importorskip("torch")  # the optional extra [train]
    f = tmp_path / "d.npz"
    np.savez(f, **synthetic_pairs(24))
    outs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        r = runner.invoke(
            app,
            ["train", "--data", str(f), "--out", str(tmp_path / name), "--seed", str(seed),
             "--epochs", "2", "--members", "2", "--width", "4", "--kind", "unet"],
        )
        assert r.exit_code == 0, r.output
        with np.load(tmp_path / name / "unet_ensemble.npz") as z:
            outs.append({k: z[k] for k in z.files})
    assert all(np.array_equal(outs[0][k], outs[1][k]) for k in outs[0])
    assert any(not np.array_equal(outs[0][k], outs[2][k]) for k in outs[0])
    p = Predictor.load(tmp_path / "a")
    assert p.predict(np.ones((3, 2)) * 0.5 + np.eye(3, 2) * 0.3).speed.shape == (2, 5)
    r = runner.invoke(app, ["eval", "--data", str(f), "--model", str(tmp_path / "a"), "--json"])
    assert r.exit_code == 0, r.output


def test_cli_train_bad_data(tmp_path):
    r = runner.invoke(app, ["train", "--data", str(tmp_path / "nope.npz"), "--out", str(tmp_path)])
    assert r.exit_code != 0 and "Traceback" not in r.output


def test_dummy_snap_only_touches_columns_near_the_dummy(tmp_path):
    pytest.importorskip("torch")
    from miso.predict.data import DUMMY_MIG
    from miso.predict.predictor import save_ensemble
    from miso.predict.train import TrainConfig, train_ensemble

    d = synthetic_pairs(24)
    from miso.predict.data import PairData

    cfg = TrainConfig(width=4, epochs=2, members=2)
    save_ensemble(train_ensemble(PairData(d["mps"], d["mig"], d["mix_id"]), cfg), tmp_path,
                  {"config": cfg.as_dict(), "snap_dummy_tol": 0.2})
    unet = Predictor.load(tmp_path)
    assert unet.kind == "unet"
    mps = d["mps"]
    raw = unet.predict_mig_normalised(mps, snap=False)
    snapped = unet.predict_mig_normalised(mps)
    changed = np.any(raw != snapped, axis=1)  # N, 7
    near = np.abs(raw - DUMMY_MIG[None, :, None]).max(axis=1) < unet.snap_tol
    assert changed.any() == near.any()
    assert not (changed & ~near).any()
    np.testing.assert_array_equal(snapped.transpose(0, 2, 1)[changed], np.broadcast_to(
        DUMMY_MIG, (int(changed.sum()), 3)))
