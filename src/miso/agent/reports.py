"""Checks of what a job writes and the agent reads: a job's progress file is hostile input.

The agent (root on a real node) reads each attempt's progress file on every poll. Whatever
the file holds - not JSON, not an object, ``"time": "x"``, ``[1]``, NaN, 10**400, a path with a
NUL byte, a 1 GB string - :func:`check_progress` turns it into either a clean dict of the
known fields or one line saying what is wrong, never an exception: a bad file makes that
job's reports invalid (``report_error``), never the node's poll.
"""

from __future__ import annotations

import math
from typing import Any

#: Largest number a job may report (iterations, times): beyond it a float loses whole units.
MAX_NUMBER = 2.0 ** 53
#: Longest checkpoint path a job may report.
MAX_PATH = 4096


class BadReport(ValueError):
    """A job-written file that does not hold what miso expects."""


def _number(data: dict[str, Any], key: str, *, integral: bool = False) -> float | int | None:
    v = data.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadReport(f"{key!r} is not a number")
    if isinstance(v, int) and abs(v) > MAX_NUMBER:
        raise BadReport(f"{key!r} is out of range")
    if isinstance(v, float) and (not math.isfinite(v) or abs(v) > MAX_NUMBER):
        raise BadReport(f"{key!r} is not a finite number in range")
    if integral and isinstance(v, float) and not v.is_integer():
        raise BadReport(f"{key!r} is not a whole number")
    if v < 0:
        raise BadReport(f"{key!r} is negative")
    return int(v) if integral else v


def _flag(data: dict[str, Any], key: str) -> bool | None:
    v = data.get(key)
    if v is None:
        return None
    if not isinstance(v, (bool, int)) or isinstance(v, int) and v not in (0, 1):
        raise BadReport(f"{key!r} is not true or false")
    return bool(v)


def _path(v: Any, key: str) -> str:
    if not isinstance(v, str) or not v or len(v) > MAX_PATH or "\0" in v:
        raise BadReport(f"{key!r} is not a path")
    return v


def check_progress(data: Any) -> dict[str, Any]:
    """The known fields of a progress file, checked; raises :class:`BadReport`."""
    if not isinstance(data, dict):
        raise BadReport("the progress file does not hold a JSON object")
    out: dict[str, Any] = {}
    for key in ("iteration", "total", "time"):
        v = _number(data, key)
        if v is not None:
            out[key] = v
    v = _number(data, "start_iteration", integral=True)
    if v is not None:
        out["start_iteration"] = v
    for key in ("helper", "checkpointable", "done"):
        f = _flag(data, key)
        if f is not None:
            out[key] = f
    ck = data.get("checkpoint")
    if ck is not None:
        if not isinstance(ck, dict):
            raise BadReport("'checkpoint' is not an object")
        it = _number(ck, "iteration", integral=True)
        if it is not None and out.get("total") is not None and it > out["total"]:
            raise BadReport(f"checkpoint iteration {it} is beyond the job's total "
                            f"{out['total']}")
        out["checkpoint"] = {"iteration": it, "path": _path(ck.get("path"), "checkpoint.path")}
    return out


def check_exit_record(data: Any) -> dict[str, Any] | None:
    """``{"returncode", "fenced", "limit"}`` of a guard's exit record, or None when it is not
    one (``limit``: why the guard ended the job for a bound, else "")."""
    if not isinstance(data, dict):
        return None
    rc, fenced = data.get("returncode"), data.get("fenced")
    if rc is not None and (isinstance(rc, bool) or not isinstance(rc, int)
                           or not -256 <= rc <= 256):
        return None
    if not isinstance(fenced, bool):
        return None
    limit = data.get("limit")
    return {"returncode": rc, "fenced": fenced,
            "limit": " ".join(limit.split())[:300] if isinstance(limit, str) else ""}
