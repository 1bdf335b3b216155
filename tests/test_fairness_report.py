"""Fairness figures (issue 31): sharing incentive against each owner alone on its entitled
share, finish-time fairness per job, the price against fair share off."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from miso.cli import app
from miso.sim.fairness import entitled_gpus, fairness_report
from miso.sim.result import SimResult


def _run(ids, owners, submit, finish, restarts=0, reclaims=0):
    n = len(ids)
    return SimResult(policy="p", job_ids=list(ids), submit=np.array(submit, float),
                     finish=np.array(finish, float), duration=np.full(n, 100.0),
                     restarts=np.full(n, restarts), busy_gpu_s=1.0, n_gpus=2, events=0,
                     decisions=0, owners=list(owners), reclaims=reclaims)


def test_entitled_gpus_follow_weights_with_one_at_least():
    assert entitled_gpus({"a": 2.0, "b": 1.0}, 9) == {"a": 6, "b": 3}
    assert entitled_gpus({"a": 1.0, "b": 1.0}, 16) == {"a": 8, "b": 8}
    assert entitled_gpus({"big": 100.0, "tiny": 1.0}, 4)["tiny"] == 1
    with pytest.raises(ValueError):
        entitled_gpus({"a": 0.0}, 4)


def test_report_by_hand():
    # shared run: a1 JCT 300, a2 JCT 500 (owner a), b1 JCT 200 (owner b)
    shared = _run(["a1", "a2", "b1"], ["a", "a", "b"], [0, 0, 0], [300, 500, 200],
                  restarts=1, reclaims=2)
    off = _run(["a1", "a2", "b1"], ["a", "a", "b"], [0, 0, 0], [200, 300, 700])
    alone = {"a": _run(["a1", "a2"], ["a", "a"], [0, 0], [200, 400]),
             "b": _run(["b1"], ["b"], [0], [100])}
    f = fairness_report(shared, off, alone, {"a": 1, "b": 1})
    assert f["price"] == pytest.approx(1000 / 1200 - 1)       # fair share helps here
    assert f["sharing_incentive"] == {"a": pytest.approx(400 / 300), "b": pytest.approx(2.0)}
    assert f["sharing_incentive_max"] == pytest.approx(2.0)
    rho = [300 / 200, 500 / 400, 200 / 100]
    assert f["rho_max"] == pytest.approx(2.0)
    assert f["rho_p95"] == pytest.approx(float(np.percentile(rho, 95)))
    assert f["rho_jain"] == pytest.approx(sum(rho) ** 2 / (3 * sum(r * r for r in rho)))
    assert f["reclaims"] == 2 and f["restarts"] == 3 and f["off_restarts"] == 0


def test_report_needs_owners():
    r = _run(["j"], [""], [0], [1])
    with pytest.raises(ValueError, match="owners"):
        fairness_report(r, r, {}, {})


def test_simulate_fairness_report_json(tmp_path):
    out = tmp_path / "f.json"
    res = CliRunner().invoke(app, [
        "simulate", "--gpus", "4", "--jobs", "40", "--mean-interarrival", "60",
        "--tenants", "2", "--tenant-skew", "0.8", "--fair-share", "--fairness-report",
        "--policy", "nopart,miso+", "--seed", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    for p in ("nopart", "miso+"):
        f = data["policies"][p]["fairness"]
        assert set(f["sharing_incentive"]) == {"u0", "u1"}
        assert f["entitled_gpus"] == {"u0": 2, "u1": 2}
        for o, si in f["sharing_incentive"].items():
            assert si == pytest.approx(f["owners_avg_jct_s"][o] / f["owners_alone_avg_jct_s"][o])
        assert f["price"] == pytest.approx(f["avg_jct_s"] / f["off_avg_jct_s"] - 1)
        assert f["rho_max"] >= f["rho_p95"] > 0
        assert f["avg_jct_s"] == pytest.approx(data["policies"][p]["avg_jct_s"])
        assert f["reclaims_useless"] == 0 and f["reclaim_events"] <= f["reclaims"]
    # the default fairness price, in the config; --demand-per-job fixes the cap instead
    assert data["config"]["tenancy"]["fairness_price"] == 0.05
    for bad, why in ((["--fairness-price", "1.5"], "--fairness-price must be"),
                     (["--fairness-price", "0.1", "--demand-per-job", "0.5"], "give one")):
        res = CliRunner().invoke(app, ["simulate", "--gpus", "2", "--jobs", "5",
                                       "--fair-share", *bad])
        assert res.exit_code != 0 and why in res.output, res.output


def test_fairness_report_refuses_ownerless_jobs(tmp_path):
    res = CliRunner().invoke(app, ["simulate", "--gpus", "2", "--jobs", "5",
                                   "--fairness-report", "--policy", "nopart"])
    assert res.exit_code != 0
    assert "needs owners" in res.output
