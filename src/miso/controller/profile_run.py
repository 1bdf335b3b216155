"""A profiling run on a whole GPU: the jobs together under MPS at each level in turn, each
job's rate measured from its progress reports.

The executor (:mod:`~miso.controller.executor`) clears the GPU first; :class:`ProfileRun`
launches the jobs at every level (:func:`~miso.sched.events.profiling_run_order`), measures,
and fills a level without a usable reading by the one rule of :mod:`miso.sched.profiles`.
"""

from __future__ import annotations

import time
from typing import Protocol

from miso.controller.launcher import Launcher
from miso.controller.runtime import Run, Runtime
from miso.mig import Placement
from miso.sched import Decision, StartProfiling
from miso.sched.events import profiling_run_order
from miso.sched.profiles import fill_missing_levels

#: A job's note when it ran during profiling but never reported progress.
NOT_PROFILED = "not profiled: no progress reports"


class Supersedable(Protocol):
    """The GPU worker running the profile: it says when a newer plan makes this one moot."""

    def superseded(self, d: Decision) -> bool: ...


class ProfileRun:
    """Measures the jobs of a :class:`StartProfiling` (see the module docstring)."""

    def __init__(self, rt: Runtime, launcher: Launcher) -> None:
        self.rt = rt
        self.launcher = launcher

    def measure(self, d: StartProfiling, full: Placement,
                worker: Supersedable) -> dict[str, tuple[float, ...]] | None:
        """Speeds of each job at ``d.levels``; None when a newer plan superseded ``d``."""
        rt = self.rt
        levels = list(d.levels)
        order = profiling_run_order(d.levels)
        rates: dict[str, dict[int, float]] = {j: {} for j in d.jobs}
        for i, lvl in enumerate(order):
            if worker.superseded(d):
                return None
            runs = [r for r in (self.launcher.launch(j, d.gpu, full, lvl, profiling=True)
                                for j in d.jobs) if r is not None]
            self._await_progress(runs)
            silent = [r for r in runs if r.last.get("checkpointable") is False]
            for r in silent:
                rt.store.progress(r.job, note=NOT_PROFILED)
            if lvl in levels:
                measured = [r for r in runs if r.job not in {x.job for x in silent}]
                for j, r in self._rates(measured, d.seconds_per_level, worker, d).items():
                    rates[j][lvl] = r
            if i < len(order) - 1:
                self.launcher.stop([r for r in runs if not r.done.is_set()])
        speeds: dict[str, tuple[float, ...]] = {}
        for j in d.jobs:
            got = rates[j]
            if not got:
                continue  # finished, failed or never started during the run
            # a level without a usable reading: the one rule of miso.sched.profiles
            speeds[j] = fill_missing_levels([got.get(lv) for lv in levels])
        return speeds

    def _await_progress(self, runs: list[Run]) -> None:
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and not self.rt.stopping.is_set():
            # a job the agent found silent (no progress within its grace) is not waited for
            if all(r.done.is_set() or (r.last.get("time") or 0) >= r.launched or
                   r.last.get("checkpointable") is False for r in runs):
                break
            time.sleep(self.rt.cfg.poll_interval / 2)
        time.sleep(self.rt.cfg.profile_warmup_s)

    def _rates(self, runs: list[Run], seconds: float, worker: Supersedable,
               d: Decision) -> dict[str, float]:
        """Rate of each run over (at least) ``seconds``: first to last progress sample seen.

        The window is stretched (up to 4x) until every live run has two distinct samples, so a
        loaded node still yields a measurement for every job.
        """
        first: dict[str, tuple[float, float]] = {}
        last: dict[str, tuple[float, float]] = {}

        def sample() -> None:
            for r in runs:
                if r.done.is_set() or r.last.get("iteration") is None:
                    continue
                pt = (float(r.last["iteration"]), float(r.last["time"]))
                first.setdefault(r.job, pt)
                if pt[1] > first[r.job][1]:
                    last[r.job] = pt

        start = time.monotonic()
        while not worker.superseded(d) and not self.rt.stopping.is_set():
            sample()
            waited = time.monotonic() - start
            live = [r for r in runs if not r.done.is_set()]
            if waited >= seconds and (all(r.job in last for r in live) or
                                      waited >= 4 * seconds + 2.0):
                break
            time.sleep(min(0.05, self.rt.cfg.poll_interval / 2))
        return {j: (last[j][0] - first[j][0]) / (last[j][1] - first[j][1]) for j in last}
