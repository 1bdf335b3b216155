"""What miso+ says about its plans: the trigger names and the one-line note of a plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: event type -> the trigger named in a decision's explanation (``why["trigger"]``)
TRIGGERS = {"JobSubmitted": "arrival", "JobFinished": "completion", "JobFailed": "completion",
             "ProfilingFinished": "profiled", "JobSpeedChanged": "speed_change",
             "GpuAdded": "node_change", "GpuRemoved": "node_change", "LayoutFailed": "failure",
             "LayoutApplied": "applied", "Tick": "timer", "SpeedObserved": "observed"}


def explain_plan(g: str, thr: float, cur: float | None, restarted: Sequence[str],
                 horizon: float | None, restart_costs: Mapping[str, float]) -> str:
    """The plan's one-line note. ``restart_costs``: what each restarted job's restart was
    priced at (s), the same figure the plan was chosen with (its learned cost, or the
    prior)."""
    if cur is None:
        return f"{g}: best layout for its mix, total speed {thr:.2f} (nothing ran before)"
    moved = ", ".join(restarted) or "none"
    if horizon is None:
        return f"{g}: total speed {cur:.2f} -> {thr:.2f}; restarts: {moved}"
    priced = ", ".join(f"{j} ({restart_costs[j]:.3g} s)" for j in restarted) or "none"
    return (f"{g}: total speed {cur:.2f} -> {thr:.2f} over a {horizon:.0f} s horizon; restarts "
            f"(each at its restart price): {priced}; chosen because the gain beats the "
            "restarts")
