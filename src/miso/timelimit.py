"""Slurm-style time limits (``miso submit --time``): ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
``D-HH:MM``, ``D-HH:MM:SS`` (``sbatch --time``'s formats), to seconds and back. Pure."""

from __future__ import annotations

import re

#: The longest limit accepted (a year), in seconds.
MAX_TIME_S = 365 * 86400.0

_FORMS = (
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("d", "h", "m", "s")),
)
_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_time(text: str) -> float:
    """Seconds of a Slurm time limit; one-line ValueError when it is none of the formats (ASCII
    digits only), zero, or longer than :data:`MAX_TIME_S`."""
    t = str(text).strip()
    for rx, units in _FORMS:
        m = rx.match(t) if t.isascii() else None
        if m:
            s = float(sum(int(v) * _UNIT[u] for v, u in zip(m.groups(), units, strict=True)))
            if not 0 < s <= MAX_TIME_S:
                break
            return s
    raise ValueError(f"time limit {text!r}: expected MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                     f"D-HH:MM:SS, more than 0 and at most 365 days")


def format_time(seconds: float) -> str:
    """``[D-]HH:MM:SS`` (Slurm's own way of showing a limit)."""
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"
