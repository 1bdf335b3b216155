"""Job dependencies (``miso submit --after JOB``, Slurm's ``--dependency=afterany``): a job
that names others in ``JobSpec.after`` is not eligible until each of them has ended, finished
or failed (cancelled included). The driver step (:class:`~miso.sched.driver.DriverStep`)
holds its submission here and delivers it, at the time the last dependency ends, as if it
arrived then; the policy never sees a job that may not run yet. One rule for both drivers.

A dependency the state does not know is taken as ended: the live controller checks at
submission that it exists, and after a restart only active jobs are known again.
"""

from __future__ import annotations

from miso.jobstatus import CORE_ENDED
from miso.sched.events import JobSubmitted
from miso.sched.state import ClusterState


class Dependencies:
    """Submissions held until their dependencies ended: job -> its :class:`JobSubmitted`,
    in submission order."""

    def __init__(self) -> None:
        self.held: dict[str, JobSubmitted] = {}

    def waits(self, ev: JobSubmitted, state: ClusterState) -> bool:
        """True (and the submission kept) when a job of ``ev.job.after`` has not ended."""
        if not ev.job.after or not self.pending(ev.job.after, state):
            return False
        self.held[ev.job.id] = ev
        return True

    def pending(self, after: tuple[str, ...], state: ClusterState) -> list[str]:
        """The dependencies in ``after`` that have not ended (held ones included)."""
        out = []
        for dep in after:
            js = state.jobs.get(dep)
            if dep in self.held or (js is not None and js.status not in CORE_ENDED):
                out.append(dep)
        return out

    def released(self, state: ClusterState) -> list[JobSubmitted]:
        """The held submissions whose dependencies have all ended now (forgotten here), in
        submission order."""
        if not self.held:
            return []
        ready = [j for j, ev in self.held.items() if not self.pending(ev.job.after, state)]
        return [self.held.pop(j) for j in ready]

    def forget(self, job: str) -> bool:
        """Drop a held job (cancelled before it was eligible); True when it was held."""
        return self.held.pop(job, None) is not None

    def waiting(self) -> dict[str, tuple[str, ...]]:
        """Held job -> the jobs it waits for (all of its ``after``)."""
        return {j: ev.job.after for j, ev in self.held.items()}
