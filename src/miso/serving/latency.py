"""The latency model the live side reads: the catalogue's (``miso.serving.catalog``, issue 28)
when it is there, else :class:`PlaceholderModel`.

PLACEHOLDER: the numbers of :class:`PlaceholderModel` are rough stand-ins in the shape of the
reference (batch-1 latency x min(7/g, k), throughput ~ (g/7) x 0.9 of a full GPU) so the live
path can run before the catalogue lands; they are not measurements. Once
``miso.serving.catalog`` exists every call goes there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class _Entry:
    batch1_ms: float  # batch-1 latency on a full A100 (PLACEHOLDER)
    item_ms: float  # each further item of a batch on a full A100 (PLACEHOLDER)
    k: float  # batch-1 latency cap factor on a small slice (reference: 1.4 .. 7.7)
    max_batch: int
    load_s: float


_PLACEHOLDER = {
    "resnet50": _Entry(1.0, 0.035, 1.41, 64, 2.0),
    "bert-large": _Entry(4.0, 0.30, 3.45, 32, 5.0),
    "3d-unet": _Entry(40.0, 20.0, 7.72, 4, 5.0),
    "llm": _Entry(25.0, 1.5, 7.0, 16, 10.0),
}


class PlaceholderModel:
    """PLACEHOLDER latency model (see the module docstring)."""

    def _entry(self, model: str) -> _Entry:
        if model not in _PLACEHOLDER:
            raise KeyError(f"unknown model {model!r} (known: {', '.join(sorted(_PLACEHOLDER))})")
        return _PLACEHOLDER[model]

    def service_time_s(self, model: str, gpu_model: str, profile: str, batch: int) -> float:
        e = self._entry(model)
        g = _slices(profile)
        b1 = e.batch1_ms * min(7.0 / g, e.k)
        per_item = e.item_ms * 7.0 / g / 0.9
        return (b1 + per_item * max(0, batch - 1)) / 1000.0

    def max_batch(self, model: str, gpu_model: str, profile: str) -> int:
        return self._entry(model).max_batch

    def load_time_s(self, model: str) -> float:
        return self._entry(model).load_s

    def capacity_rps(self, model: str, gpu_model: str, profile: str, slo_p99_ms: float,
                     percentile: float = 99.0) -> float:
        """Largest batch whose (queueing wait of one batch + service) fits the SLO, at the
        rate that batch sustains (a crude bound; the catalogue's model replaces it)."""
        best = 0.0
        for b in range(1, self.max_batch(model, gpu_model, profile) + 1):
            t = self.service_time_s(model, gpu_model, profile, b)
            if 2 * t * 1000.0 <= slo_p99_ms:
                best = max(best, b / t)
        return best * 0.8


def _slices(profile: str) -> int:
    """Compute slices of a profile name ("1g.5gb" -> 1, "7g.40gb" -> 7; "" = a whole GPU)."""
    if not profile or "g" not in profile:
        return 7
    try:
        return max(1, int(profile.split("g", 1)[0]))
    except ValueError:
        return 7


def latency_model() -> object:
    """``miso.serving.catalog`` (issue 28) if it is importable, else the placeholder."""
    try:
        from miso.serving import catalog  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:
        return PlaceholderModel()
    return catalog


def ceil_div(a: float, b: float) -> int:
    return max(1, math.ceil(a / b)) if b > 0 else 1
