"""The incremental index of GPUs' free times (sched/freetimes.py) answers exactly as the scan of
every GPU it replaces, through random changes of a cluster state: time passing, progress
reports, estimates changed (replaced, edited in place, dropped), jobs moved, placed, finished,
GPUs removed and added, the typical work changed; steep GPUs (fast jobs on slow estimates)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from miso.mig import Placement
from miso.sched.events import (
    GpuAdded,
    GpuRemoved,
    JobFinished,
    JobProgress,
    JobSpec,
    JobSubmitted,
)
from miso.sched.freetimes import FreeTimes, WatchedDict, brute_soonest, end_time
from miso.sched.state import ClusterState, JobStatus

MODEL = "A100-40GB"


class _Everyone:
    """A learner's ``seen`` that holds every job (the index runs only when a scan would
    record nobody's work)."""

    def __contains__(self, j: object) -> bool:
        return True


def _never(j: str, w: float) -> None:
    raise AssertionError("the index must not record works")


class World:
    """A cluster state, its estimates and the index, changed at random."""

    def __init__(self, rng: random.Random, gpus: int = 12) -> None:
        self.rng = rng
        self.st = ClusterState()
        self.index = FreeTimes()
        self.est: dict[str, Any] = WatchedDict(self.index.job_changed)
        self.typical = 300.0
        self.n_gpus = self.n_jobs = 0
        for _ in range(gpus):
            self.add_gpu()
        for _ in range(3 * gpus):
            self.new_job()

    def add_gpu(self) -> None:
        self.st.observe(self.st.now, GpuAdded(f"g{self.n_gpus}", MODEL))
        self.n_gpus += 1

    def new_job(self) -> None:
        j = f"j{self.n_jobs}"
        self.n_jobs += 1
        self.st.observe(self.st.now, JobSubmitted(JobSpec(j, "x", 1.0)))
        self.place(j)

    def place(self, j: str) -> None:
        gs = self.rng.choice(list(self.st.gpus.values()))
        js = self.st.jobs[j]
        if js.gpu in self.st.gpus and j in self.st.gpus[js.gpu].jobs:
            old = self.st.gpus[js.gpu]
            old.jobs.remove(j)
            old.assignment.pop(j, None)
            self.st.notify(old.id)
        elif j in self.st.queue:
            self.st.queue.remove(j)
        gs.jobs.append(j)
        js.gpu, js.status = gs.id, JobStatus.RUNNING
        if self.rng.random() < 0.8:
            prof = self.rng.choice(gs.geom.profiles).name
            gs.assignment[j] = js.placement = Placement(0, prof)
        self.st.notify(gs.id)

    def resident(self) -> str | None:
        jobs = [j for gs in self.st.gpus.values() for j in gs.jobs]
        return self.rng.choice(jobs) if jobs else None

    def step(self) -> None:
        """One random change."""
        rng, st = self.rng, self.st
        j = self.resident()
        op = rng.randrange(9)
        if op == 0:
            st.now += rng.choice([0.0, 0.5, 20.0, 400.0])
        elif op == 1 and j is not None:
            st.observe(st.now, JobProgress(j, rng.uniform(0.0, 3000.0),
                                           rng.choice([0.0, 0.3, 1.0, 2.5])))
        elif op == 2 and j is not None:
            prof = rng.choice(st.gpus[st.jobs[j].gpu].geom.profiles).name  # type: ignore
            self.est[j] = {prof: rng.choice([0.02, 0.3, 0.7, 1.0, 1.3])}
        elif op == 3 and j in self.est:
            inner = self.est[j]
            inner[next(iter(inner))] = rng.choice([0.04, 0.5, 1.2])  # edited in place
        elif op == 4 and j is not None:
            self.est.pop(j, None)
        elif op == 5 and j is not None:
            self.place(j)
        elif op == 6 and j is not None:
            st.observe(st.now, JobFinished(j))
            self.new_job()
        elif op == 7:
            if rng.random() < 0.5 and len(st.gpus) > 2:
                st.observe(st.now, GpuRemoved(rng.choice(list(st.gpus))))
                for q in list(st.queue):
                    self.place(q)
            else:
                self.add_gpu()
        else:
            self.typical = rng.choice([self.typical, 50.0, 300.0, 5000.0])

    def evaluate(self, g: str) -> tuple[float, float, bool]:
        gs = self.st.gpus[g]
        if not gs.jobs:
            return 0.0, 0.0, False
        typ = self.typical
        ctx = (self.st.now, self.st.jobs, self.est, _Everyone(), _never, lambda: typ)
        return end_time(gs.jobs, gs.assignment, gs.geom.model.full_profile().name, ctx)


@pytest.mark.parametrize("seed", range(6))
def test_index_answers_as_the_scan(seed: int) -> None:
    rng = random.Random(seed)
    w = World(rng)
    for _ in range(400):
        for _ in range(rng.randrange(1, 6)):
            w.step()
        m = rng.choice([1, 2, 5, 9, 40])
        got = w.index.soonest(w.st, m, w.typical, w.evaluate)
        assert got == brute_soonest(list(w.st.gpus), m, w.evaluate)


def test_index_evaluates_only_changed_or_soonest_gpus() -> None:
    """At a second ask with nothing changed and little time gone, only the GPUs that may be
    among the soonest are evaluated, not every GPU."""
    rng = random.Random(7)
    w = World(rng, gpus=200)
    for j in list(w.st.jobs):
        w.st.observe(w.st.now, JobProgress(j, rng.uniform(100.0, 5000.0), 1.0))
        gs = w.st.gpus[w.st.jobs[j].gpu]  # type: ignore[index]
        w.est[j] = {p.name: 1.0 for p in gs.geom.profiles}
    w.index.soonest(w.st, 5, w.typical, w.evaluate)
    w.st.now += 1.0
    asked: list[str] = []

    def counting(g: str) -> tuple[float, float, bool]:
        asked.append(g)
        return w.evaluate(g)
    got = w.index.soonest(w.st, 5, w.typical, counting)
    assert got == brute_soonest(list(w.st.gpus), 5, w.evaluate)
    assert 5 <= len(asked) < 50


def test_watched_dict_reports_writes_and_item_reads() -> None:
    seen: list[str] = []
    d = WatchedDict(seen.append, {"a": {"p": 1.0}})
    d.get("a")
    assert seen == []
    d["a"]["p"] = 2.0
    d["b"] = {}
    d.update(c={})
    d.pop("b")
    d.setdefault("e", {})
    del d["c"]
    assert seen == ["a", "b", "c", "b", "e", "c"]
    assert d == {"a": {"p": 2.0}, "e": {}}
