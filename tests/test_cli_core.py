"""CLI of the hardware model and optimizer: JSON shapes and one-line errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from miso.cli import app

runner = CliRunner()


def test_layouts_json_counts():
    res = runner.invoke(app, ["layouts", "--gpu", "A100-40GB", "--driver", "470", "--maximal",
                              "--profiles", "1g.5gb,2g.10gb,3g.20gb,4g.20gb,7g.40gb", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert len(data) == 18
    assert all(set(pl) == {"profile", "start"} for lay in data for pl in lay)
    res = runner.invoke(app, ["layouts", "--gpu", "A100-40GB", "--maximal", "--json"])
    assert len(json.loads(res.stdout)) == 19


def test_gpus_lists_every_model():
    res = runner.invoke(app, ["gpus", "--json"])
    assert res.exit_code == 0
    names = {m["name"] for m in json.loads(res.stdout)}
    assert {"A100-40GB", "A30-24GB", "H100-80GB", "H200-141GB", "B200-180GB",
            "RTX-PRO-6000"} <= names


def test_optimize_json(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"jobs": {
        "a": {"7g.40gb": 1.0, "4g.20gb": 0.9, "3g.20gb": 0.85, "2g.10gb": 0.6, "1g.5gb": 0.3},
        "b": {"7g.40gb": 1.0, "4g.20gb": 0.5, "3g.20gb": 0.45, "2g.10gb": 0.3},
    }}))
    res = runner.invoke(app, ["optimize", "--gpu", "A100-40GB", "--speeds", str(f), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) == {"objective", "layout"}
    assert {pl["job"] for pl in out["layout"]} == {"a", "b"}
    assert all(set(pl) == {"profile", "start", "job"} for pl in out["layout"])
    assert out["objective"] == sum(
        {"a": {"4g.20gb": 0.9, "3g.20gb": 0.85}, "b": {"4g.20gb": 0.5, "3g.20gb": 0.45}}
        [pl["job"]][pl["profile"]] for pl in out["layout"])


def _err(args):
    res = runner.invoke(app, args)
    assert res.exit_code != 0
    lines = [ln for ln in res.output.strip().splitlines() if ln]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


def test_bad_input_is_one_line(tmp_path):
    assert "unknown GPU model" in _err(["layouts", "--gpu", "Z100"])
    assert "no MIG profile" in _err(["layouts", "--gpu", "A100-40GB", "--profiles", "5g.1gb"])
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    assert "not valid JSON" in _err(["optimize", "--gpu", "A100-40GB", "--speeds", str(f)])
    f.write_text(json.dumps({"jobs": {"a": {"7g.40gb": 3.0}}}))
    assert "outside (0, 1.5]" in _err(["optimize", "--gpu", "A100-40GB", "--speeds", str(f)])
    f.write_text(json.dumps({"jobs": {"a": {"8g.1gb": 0.3}}}))
    assert "not one of" in _err(["optimize", "--gpu", "A100-40GB", "--speeds", str(f)])
    f.write_text(json.dumps({"tasks": {}}))
    assert "expected" in _err(["optimize", "--gpu", "A100-40GB", "--speeds", str(f)])
    assert "no such file" in _err(["optimize", "--gpu", "A100-40GB", "--speeds",
                                str(tmp_path / "nope.json")])
