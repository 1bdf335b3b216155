"""The node protocol's wire forms, below every layer that speaks it (the agent writes and
answers them, the transport carries them, the controller sends and reads them;
docs/architecture.md, "Layers"). With :mod:`miso.attemptstatus` (an attempt's states) and
:mod:`miso.nodeerrors` (a node that cannot be reached) this is the whole vocabulary shared
by agent and controller.

* A GPU's layout on the wire: ``[[start, profile], ...]`` in canonical order
  (:func:`layout_data`); :func:`placement_of` reads one slice from any accepted form.
* An attempt's directory under its agent's workdir, and its exit record there
  (``exit.json``, written by the attempt's guard: ``{"returncode", "fenced", "why", "time"}``),
  which the controller reads when the node is gone or the controller restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miso.mig import Placement, canonical


def placement_of(data: Any) -> Placement:
    """Placement from ``[start, profile]`` / ``{"start":..,"profile":..}`` / a Placement."""
    if isinstance(data, Placement):
        return data
    if isinstance(data, dict):
        return Placement(int(data["start"]), str(data["profile"]))
    start, profile = data
    return Placement(int(start), str(profile))


def layout_data(layout: Any) -> list[list[Any]]:
    """A layout as JSON-friendly ``[[start, profile], ...]``."""
    return [[p.start, p.profile] for p in canonical(placement_of(x) for x in layout)]


def attempt_dir(workdir: str | Path, job: str, attempt: int) -> Path:
    """The agent's directory of one attempt (log, job files, exit record)."""
    return Path(workdir) / "jobs" / job / f"attempt-{attempt}"


def exit_record_path(workdir: str | Path, job: str, attempt: int) -> Path:
    """Where the guard of an attempt records how it ended (see :mod:`miso.agent.guard`)."""
    return attempt_dir(workdir, job, attempt) / "exit.json"
