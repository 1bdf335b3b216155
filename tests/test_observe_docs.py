"""Every metric the registry exposes is documented in docs/metrics.md, and the Grafana
dashboard only queries metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from miso.observe import Metrics

ROOT = Path(__file__).resolve().parents[1]
SNAP = {"time": 10.0, "queue": [], "jobs": [{"id": "1", "state": "running", "owner": "a"}],
        "gpus": [{"id": "n/0", "node": "n", "model": "A100-40GB", "phase": "running",
                  "layout": ["7g.40gb@0"], "assignment": {"1": "7g.40gb@0"}, "jobs": ["1"]}],
        "owners": {"a": {"usage_gpu_s": 5.0, "in_use": 1.0, "weight": 1.0, "fair_share": 0.5}}}


def families() -> dict[str, str]:
    text = Metrics(status=lambda: SNAP).render().decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_every_exposed_metric_is_documented() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    fams = families()
    assert len(fams) >= 20
    for name, kind in fams.items():
        shown = name + ("_total" if kind == "counter" else "_info" if kind == "info" else "")
        assert f"`{shown}`" in doc, shown
        assert shown.startswith("miso_")


def test_grafana_dashboard_queries_only_existing_metrics() -> None:
    dash = json.loads((ROOT / "docs" / "grafana" / "miso.json").read_text())
    fams = families()
    known = set()
    for name in fams:
        known |= {name, f"{name}_total", f"{name}_info", f"{name}_bucket", f"{name}_sum",
                  f"{name}_count"}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bmiso_[a-z_]+", e)}
    assert used and used <= known, used - known
    for want in ("miso_api_request_duration_seconds_bucket", "miso_queue_length",
                 "miso_job_restarts_total", "miso_gpu_busy_compute_slices"):
        assert want in used
