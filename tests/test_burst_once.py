"""Issue 17: miso+'s burst test (:meth:`Burst.burst`, stateful: a hysteresis) is asked several
times per decision; it is computed once per decision and answers as before."""

from __future__ import annotations

from miso.cli.demo_cluster import demo_jobs, demo_trace
from miso.sched.policies import MisoPlus
from miso.sched.policies.arrivals import ArrivalClock
from miso.sched.policies.burst import Burst
from miso.sim.engine import Simulator
from miso.sim.run import build_policy
from miso.sim.world import WorldConfig

CFG = WorldConfig(n_gpus=4, restart_s=3.0, profile_s_per_level=1.0, reconfig_s=0.5,
                  declare_work=False)


class Counted(MisoPlus):
    """Counts the burst test's offered-load reads (``burst_samples`` arrivals) per decision
    and measured works; remembers every answer."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.reads: list[tuple[int, float]] = []
        self.answers: list[bool] = []
        self.decisions = 0
        pol = self
        load = ArrivalClock.offered_load

        class Clock(ArrivalClock):
            def offered_load(self, default_work_s: float, min_samples: int = 16):  # noqa: ANN201
                if min_samples == pol.bursts.opts.burst_samples:
                    pol.reads.append((pol.decisions, pol.work.stats[1]))
                return load(self, default_work_s, min_samples)

        self.clock = Clock(self.clock.quiet_gaps)
        self.bursts = CountedBurst(self, self.bursts.opts)

    def decide(self, now, event, state):  # noqa: ANN001, ANN201
        self.decisions += 1
        return super().decide(now, event, state)


class CountedBurst(Burst):
    """The burst stage remembering every answer."""

    pol: Counted

    def burst(self, sc):  # noqa: ANN001, ANN201
        out = super().burst(sc)
        self.pol.answers.append(out)
        return out


class UncachedBurst(Burst):
    """The burst test recomputed at every call (the code before the cache)."""

    pol: Counted

    def burst(self, sc):  # noqa: ANN001, ANN201
        out = self.bursting = self.test(sc)
        self.pol.answers.append(out)
        return out


class Uncached(Counted):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.bursts = UncachedBurst(self, self.bursts.opts)


def _run(cls: type[Counted], seed: int) -> tuple[Counted, list[float]]:
    trace = demo_trace(demo_jobs(20, seed=seed))
    est = build_policy("miso+", trace, CFG, 1).estimator
    pol = cls(restart_s=60.0, estimator=est, profile_seconds_per_level=CFG.profile_s_per_level)
    res = Simulator(pol, trace, CFG, seed=1).run()
    return pol, sorted(res.jct.tolist())


def test_burst_is_computed_once_per_decision():
    pol, _ = _run(Counted, 0)
    assert any(pol.answers)  # the demo's stream is a burst
    assert len(pol.reads) < len(pol.answers)  # asked more often than computed
    assert len(set(pol.reads)) == len(pol.reads)  # once per decision and measured work


def test_burst_cache_gives_the_answers_of_recomputing():
    for seed in (0, 2, 4):
        cached, jct = _run(Counted, seed)
        plain, jct_plain = _run(Uncached, seed)
        assert cached.answers == plain.answers
        assert jct == jct_plain
