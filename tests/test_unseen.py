"""sched/unseen.py: the hook-kept answer to "does some resident job report progress that
the learner has not seen?" is the one a scan of every GPU's jobs gives."""

from __future__ import annotations

from miso.jobstatus import CORE_ENDED
from miso.sched.unseen import UnseenResidents
from miso.sim.run import run_policy
from miso.sim.traces import poisson_jobs
from miso.sim.world import WorldConfig


def _scan(state, seen) -> bool:
    return any(j not in seen and (js := state.jobs.get(j)) is not None
               and js.progress is not None and js.status not in CORE_ENDED
               for gs in state.gpus.values() for j in gs.jobs)


def test_unseen_residents_agree_with_a_scan(monkeypatch):
    answers = []
    kept = UnseenResidents.any

    def both(self, state, seen):
        got = kept(self, state, seen)
        assert got == _scan(state, seen)
        answers.append(got)
        return got

    monkeypatch.setattr(UnseenResidents, "any", both)
    for gpus, jobs, gap in [(16, 200, 200.0), (16, 300, 60.0), (40, 400, 30.0)]:
        run_policy("miso+", poisson_jobs(jobs, seed=1, mean_interarrival_s=gap),
                   WorldConfig(n_gpus=gpus), 1)
    assert True in answers and False in answers  # both answers were put to the test
