"""Which resident jobs a learner has not seen report yet, kept from the state's change hooks
instead of scanning every GPU's jobs at every ask. Pure bookkeeping, no I/O."""

from __future__ import annotations

from collections.abc import Container

from miso.jobstatus import CORE_ENDED
from miso.sched.state import ClusterState


class UnseenResidents:
    """Answers "is some job on a GPU, reporting progress, not ended, and not in ``seen``?"
    (a learner's record, e.g. :attr:`WorkLearner.seen`) exactly as a scan of every GPU's
    jobs would, looking only at candidates: jobs placed or re-planned since (the state's GPU
    change hook) and jobs that reported since (its progress hook). A candidate that does not
    qualify is dropped; it becomes one again only through a hook (placed again, a report),
    or never (ended; ``seen`` loses a job only when it ends)."""

    def __init__(self) -> None:
        self._state: ClusterState | None = None
        self._cand: set[str] = set()

    def _bind(self, st: ClusterState) -> None:
        self._state = st
        self._cand = {j for gs in st.gpus.values() for j in gs.jobs}
        st.watch(self._gpu_changed)
        st.watch_progress(self._cand.add)

    def _gpu_changed(self, g: str) -> None:
        st = self._state
        gs = st.gpus.get(g) if st is not None else None
        if gs is not None:
            self._cand.update(gs.jobs)

    def any(self, st: ClusterState, seen: Container[str]) -> bool:
        """Whether some job on one of ``st``'s GPUs reports progress, has not ended and is
        not in ``seen``."""
        if st is not self._state:
            self._bind(st)
        jobs, gpus = st.jobs, st.gpus
        drop = []
        found = False
        for j in self._cand:
            js = jobs.get(j)
            gs = gpus.get(js.gpu) if js is not None and js.gpu is not None else None
            if gs is None or j in seen or js.progress is None \
                    or js.status in CORE_ENDED or j not in gs.jobs:  # type: ignore[union-attr]
                drop.append(j)
                continue
            found = True
            break
        self._cand.difference_update(drop)
        return found
