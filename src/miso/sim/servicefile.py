"""The services file of ``miso simulate --services FILE.yaml`` (YAML, or JSON by suffix).

::

    window_s: 30            # the planner's rate window (optional)
    services:
      - name: chat
        owner: alice
        model: llama2-7b     # a miso.serving.catalog.MODELS entry
        slo_p99_ms: 10000
        percentile: 99       # optional
        min_replicas: 1
        max_replicas: 8
        headroom: 0.2
        trace: azure:conv    # azure:conv | azure:code | a CSV/JSONL path | diurnal:MEAN_RPS
                             # | step:BASE_RPS (5x from a third to two thirds of --span-s)
        rate_multiplier: 0.4 # optional
        compress: 3          # optional time compression
        span_s: 3600         # synthetic traces' length (optional)
"""

from __future__ import annotations

import json
from pathlib import Path

from miso.sched.services import ServiceSpec
from miso.serving.catalog import MODELS
from miso.serving.traces import (
    RequestTrace,
    azure_llm_trace,
    diurnal_trace,
    load_trace,
    step_trace,
)

MAX_SERVICES = 64
_SPEC_KEYS = {"name", "owner", "model", "slo_p99_ms", "percentile", "min_replicas",
              "max_replicas", "headroom", "memory_gb"}
_TRACE_KEYS = {"trace", "rate_multiplier", "compress", "span_s", "seed"}


def _trace(entry: dict, base: Path, index: int) -> RequestTrace:
    src = str(entry.get("trace", ""))
    seed = int(entry.get("seed", index))
    span = float(entry.get("span_s", 3600.0))
    if src.startswith("azure:"):
        tr = azure_llm_trace(src.split(":", 1)[1])
    elif src.startswith("diurnal:"):
        tr = diurnal_trace(float(src.split(":", 1)[1]), span, 4.0, span, seed)
    elif src.startswith("step:"):
        tr = step_trace(float(src.split(":", 1)[1]), span, span / 3, 5.0, span / 3, seed)
    elif src:
        p = Path(src)
        tr = load_trace(p if p.is_absolute() else base / p)
    else:
        raise ValueError(f"service {index}: 'trace' is required")
    if "compress" in entry:
        tr = tr.compressed(float(entry["compress"]))
    if "rate_multiplier" in entry:
        tr = tr.scaled(float(entry["rate_multiplier"]), seed)
    return tr


def load_services(path: str | Path) -> tuple[list[tuple[ServiceSpec, RequestTrace]], float]:
    """The services of ``path`` with their request traces, and the rate window (s)."""
    p = Path(path)
    text = p.read_text()
    if p.suffix == ".json":
        doc = json.loads(text)
    else:
        import yaml

        doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), list):
        raise ValueError(f"{p}: expected a mapping with a 'services' list")
    entries = doc["services"]
    if not 1 <= len(entries) <= MAX_SERVICES:
        raise ValueError(f"{p}: 1-{MAX_SERVICES} services")
    out = []
    names = set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"{p}: service {i} is not a mapping")
        unknown = set(e) - _SPEC_KEYS - _TRACE_KEYS
        if unknown:
            raise ValueError(f"{p}: service {i}: unknown keys {', '.join(sorted(unknown))}")
        if e.get("model") not in MODELS:
            raise ValueError(f"{p}: service {i}: model must be one of {', '.join(MODELS)}")
        spec = ServiceSpec(**{k: e[k] for k in _SPEC_KEYS if k in e})
        if spec.name in names:
            raise ValueError(f"{p}: duplicate service {spec.name}")
        names.add(spec.name)
        out.append((spec, _trace(e, p.parent, i)))
    window = float(doc.get("window_s", 30.0))
    if not 1.0 <= window <= 3600.0:
        raise ValueError(f"{p}: window_s must be 1-3600")
    return out, window
