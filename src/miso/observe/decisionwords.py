"""A decision's explanation record (:mod:`miso.observe.decisions`) in words and numbers:
:func:`describe` renders one as a few lines for ``miso events`` and the web page;
:func:`timer_words` says what a timer is for. Pure: no I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def describe(rec: Mapping[str, Any]) -> str:
    """A record in words and numbers (first line: time, GPU/job, what; then why). Terminal
    control characters (from job names or failure reasons) are dropped."""
    return _CONTROL.sub("", _describe(rec))


_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _describe(rec: Mapping[str, Any]) -> str:
    kind = rec.get("kind", "?")
    t = rec.get("time", 0.0)
    where = rec.get("gpu") or "-"
    trig = rec.get("trigger", "?")
    cause = rec.get("cause") or {}
    because = trig
    if cause.get("job"):
        because += f" of job {cause['job']}" if trig in ("arrival", "completion") else \
            f" (job {cause['job']})"
    head = f"t={t:9.1f}s  {where:<10} {_headline(rec)}  [trigger: {because}]"
    lines = [head]
    if rec.get("origin"):
        lines.append(f"    after {rec['origin']}")
    if kind == "ApplyLayout":
        sp = rec.get("speeds") or {}
        std = rec.get("std") or {}
        cur = rec.get("current_assignment") or {}
        for j, pl in (rec.get("assignment") or {}).items():
            prof = str(pl).split("@")[0]
            s = sp.get(j, {}).get(prof)
            e = std.get(j, {}).get(prof) if isinstance(std, Mapping) else None
            pred = f"predicted speed {s:.3f}" if isinstance(s, (int, float)) else \
                "predicted speed unknown"
            iv = (rec.get("interval") or {}).get(j, {}).get(prof) if isinstance(
                rec.get("interval"), Mapping) else None
            if isinstance(iv, (list, tuple)) and len(iv) == 2 and all(
                    isinstance(x, (int, float)) for x in iv):
                pred += f" (95 % interval {iv[0]:.3f}-{iv[1]:.3f})"
            elif isinstance(e, (int, float)):
                pred += f" +/- {e:.3f}"
            measured = (cause.get("measured") or {}).get(j)
            if j in cur:
                was = f" (was on {cur[j]})" if cur[j] != pl else " (kept)"
            elif j in (cause.get("jobs") or []):
                was = " (from the MPS profiling run" + (
                    f": measured {measured:g} it/s with the mix at "
                    f"{cause.get('measured_level')} %)" if isinstance(measured, (int, float))
                    else ")")
            elif j in (rec.get("prior") or []):
                was = " (not profiled yet: prior estimate)"
            else:
                was = " (starts)"
            lines.append(f"    job {j:<8} -> {pl:<12} {pred}{was}")
        cl = rec.get("current_layout") or []
        lines.append(f"    current layout: {' + '.join(cl) if cl else '(none)'}")
        obj, cobj, gain = (rec.get("objective"), rec.get("current_objective"),
                           rec.get("expected_gain"))
        thr = rec.get("throughput")
        if rec.get("trigger") == "rebalance" and isinstance(gain, (int, float)):
            lines.append(f"    expected gain: finishes ~{gain:.0f} s sooner net of one restart")
        elif obj is not None:
            s = f"    objective {obj:.3f}"
            if isinstance(thr, (int, float)) and abs(thr - obj) > 5e-4:
                s = f"    throughput {thr:.3f} (objective net of restart costs {obj:.3f})"
            if cobj is not None:
                s += f", current {cobj:.3f}"
            elif rec.get("trigger") == "profiled":
                s += ", current: the MPS profiling run (no MIG layout to compare)"
            elif rec.get("current_layout"):
                s += ", current: no total for these jobs (the mix changed)"
            else:
                s += ", current: none (the GPU was empty)"
            if gain is not None:
                s += f", expected gain {gain:+.3f}"
            lines.append(s)
    if kind == "RepartitionDeclined" and isinstance(rec.get("gain"), (int, float)):
        unit = " s of completion time" if rec.get("unit") == "s" else \
            " (total speed over the plan's horizon)"
        lines.append(f"    gain {rec['gain']:.3f} vs restart price "
                     f"{rec.get('restart_price') or 0.0:.3f}{unit}; would restart: "
                     f"{', '.join(map(str, rec.get('would_restart') or [])) or 'none'}")
    if rec.get("restarts"):
        lines.append(f"    restarts: {', '.join(map(str, rec['restarts']))}")
    if rec.get("note"):
        lines.append(f"    why: {rec['note']}")
    if rec.get("detail"):
        lines.append(f"         {rec['detail']}")
    return "\n".join(lines)


def _headline(rec: Mapping[str, Any]) -> str:
    kind = rec.get("kind")
    if kind == "ApplyLayout":
        return f"plan {rec.get('plan_id')}: MIG layout {' + '.join(rec.get('layout') or [])}"
    if kind == "StartProfiling":
        return f"plan {rec.get('plan_id')}: profile {', '.join(rec.get('jobs') or [])} under MPS"
    if kind == "RunMps":
        return f"plan {rec.get('plan_id')}: MPS shares"
    if kind == "PlaceJob":
        return f"place job {rec.get('job')}"
    if kind == "RequeueJob":
        return f"requeue job {rec.get('job')}"
    if kind == "WakeUp":
        return timer_words(rec.get("tag"))
    if kind == "RepartitionDeclined":
        return (f"job {rec['job']} waits for a whole GPU" if rec.get("job") else
                "layout kept: repartition declined")
    if kind == "GpuLost":
        return "GPU lost (its node stopped answering or its agent restarted)"
    if kind == "GpuJoined":
        return "GPU back"
    return str(kind)


#: What each of the policies' timer tags is for, in words (users never read the tag).
TIMER_WORDS = {
    "quiet": "look again once arrivals have paused (re-plan with the long horizon)",
    "reclaim": "look again for slices that a finished job left idle",
    "batch": "plan the jobs that arrived together as one batch",
    "reprofile": "profile the GPU's mix again after its cool-down",
}


def timer_words(tag: object) -> str:
    """A timer decision's headline in words (``reprofile:<gpu>`` names its GPU)."""
    t = str(tag or "")
    base, _, arg = t.partition(":")
    words = TIMER_WORDS.get(base)
    if words is None:
        return "scheduled check" + (f" ({t})" if t else "")
    return f"scheduled check: {words}" + (f" on {arg}" if arg else "")
