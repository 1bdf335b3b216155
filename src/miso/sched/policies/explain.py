"""What miso+ says about its plans: the trigger names and the one-line note of a plan."""

from __future__ import annotations

from collections.abc import Sequence

#: event type -> the trigger named in a decision's explanation (``why["trigger"]``)
TRIGGERS = {"JobSubmitted": "arrival", "JobFinished": "completion", "JobFailed": "completion",
             "ProfilingFinished": "profiled", "JobSpeedChanged": "speed_change",
             "GpuAdded": "node_change", "GpuRemoved": "node_change", "LayoutFailed": "failure",
             "LayoutApplied": "applied", "Tick": "timer", "SpeedObserved": "observed"}


def explain_plan(g: str, thr: float, cur: float | None, restarted: Sequence[str],
             horizon: float | None, restart_s: float) -> str:
    if cur is None:
        return f"{g}: best layout for its mix, total speed {thr:.2f} (nothing ran before)"
    moved = ", ".join(restarted) or "none"
    if horizon is None:
        return f"{g}: total speed {cur:.2f} -> {thr:.2f}; restarts: {moved}"
    return (f"{g}: total speed {cur:.2f} -> {thr:.2f} over a {horizon:.0f} s horizon; restarts "
            f"({restart_s:.0f} s each): {moved}; chosen because the gain beats the restarts")
