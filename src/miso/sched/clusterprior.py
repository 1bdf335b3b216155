"""A prior for jobs nobody profiled, learned from the jobs this cluster has estimates for
(issue 19, item 5; miso+'s ``cluster_prior`` switch, off by default).

miso+ plans a newcomer it did not profile with the catalogue's average speed per slice
(:func:`miso.sched.speeds.prior_speeds`). On a cluster whose jobs are not the
catalogue's (every family new), the speeds of the jobs it did profile or measure describe the
population better. The harmonic mean is kept (a completion time is work / speed:
1 / E[s] < E[1 / s]). Measured in the simulator (benchmarks/README.md, "Predictor, third
pass"): within noise of the catalogue prior, so the switch stays off.
"""

from __future__ import annotations

from collections.abc import Mapping


class ClusterPrior:
    """Harmonic mean speed per profile over the jobs :meth:`add` was told about (each job's
    latest estimate counts once); a profile with fewer than ``min_jobs`` of them keeps the
    given fallback."""

    def __init__(self, min_jobs: int = 5) -> None:
        if min_jobs < 1:
            raise ValueError(f"min_jobs must be >= 1, got {min_jobs}")
        self.min_jobs = min_jobs
        self.jobs: dict[str, dict[str, float]] = {}
        self.means: dict[str, float] | None = None   # cache, None when stale

    def add(self, job: str, speeds: Mapping[str, float]) -> None:
        """Record (or replace) ``job``'s speeds relative to the full GPU."""
        clean = {p: float(v) for p, v in speeds.items() if v > 0.0}
        if self.jobs.get(job) != clean:
            self.jobs[job] = clean
            self.means = None

    def speeds(self, fallback: Mapping[str, float], full: str) -> dict[str, float]:
        """``fallback``'s profiles (the ones the job fits), each with the cluster's harmonic
        mean where ``min_jobs`` jobs have a speed there; the ``full`` GPU stays as given."""
        if self.means is None:
            inv: dict[str, list[float]] = {}
            for sp in self.jobs.values():
                for p, v in sp.items():
                    acc = inv.setdefault(p, [0.0, 0.0])
                    acc[0] += 1.0 / v
                    acc[1] += 1.0
            self.means = {p: n / s for p, (s, n) in inv.items() if n >= self.min_jobs}
        return {p: (v if p == full else self.means.get(p, v)) for p, v in fallback.items()}
