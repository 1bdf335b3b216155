"""Issue 32: miso+'s landing GPU in a burst comes from an index of the GPUs with a free slot
(:mod:`miso.sched.freeslots`) instead of a scan of every candidate GPU's layout. The index must
answer as the scan did: checked here against the scan (the code before the index, copied) on
the states of random bursty streams, at every landing decision and for every GPU."""

from __future__ import annotations

import random

import pytest

from miso.sched import freeslots
from miso.sched.decisions import ApplyLayout
from miso.sched.policies import MisoPlus
from miso.sched.policies.base import Scratch, fit_classes, fitting_profiles
from miso.sched.policies.burst import Burst
from miso.sim.engine import Simulator
from miso.sim.run import build_policy
from miso.sim.traces import TraceJob
from miso.sim.world import WorldConfig
from miso.workloads import catalogue


def scan_free_slots(sc: Scratch, g: str, job: str) -> int:
    """``Burst.free_slots`` before the index (the reference)."""
    gs = sc.state.gpus[g]
    layout = gs.pending.layout if isinstance(gs.pending, ApplyLayout) else gs.layout
    asg = gs.target_assignment()
    used = set(asg.values())
    fits = fitting_profiles(gs.geom, sc.state.jobs[job].spec.memory_gb)
    free = [pl for pl in layout if pl not in used and pl.profile in fits]
    waiting = [j for j in sc.jobs_on(g) if j not in asg]
    return len(free) - len(waiting)


class CheckedBurst(Burst):
    """The burst stage comparing every landing answer, and the index's members, with the
    scan; counts the answers (moved: another GPU than the least crowded one)."""

    def __init__(self, pol: MisoPlus, opts: object) -> None:
        super().__init__(pol, opts)  # type: ignore[arg-type]
        self.counts = {"moved": 0, "stay": 0, "gpus_checked": 0}

    def landing_gpu(self, sc: Scratch, g: str, job: str, held: str | None) -> str:
        got = super().landing_gpu(sc, g, job, held)
        if not sc.jobs_on(g) or not self.burst(sc) or scan_free_slots(sc, g, job) > 0:
            assert got == g
            return got
        want = g
        for n, h in self.pol.candidate_gpus(sc, job):  # the scan before the index
            if n >= self.opts.burst_jobs:
                break
            if n and h != g and h != held and scan_free_slots(sc, h, job) > 0:
                want = h
                break
        assert got == want
        self.counts["moved" if got != g else "stay"] += 1
        self.check_members(sc, job)
        return got

    def check_members(self, sc: Scratch, job: str) -> None:
        """Every GPU is in the index under the job's fit class exactly when the scan finds it
        a candidate with 0 < residents < ``burst_jobs`` and a free slot for the job."""
        want = [h for n, h in self.pol.candidate_gpus(sc, job)
                if 0 < n < self.opts.burst_jobs and scan_free_slots(sc, h, job) > 0]
        got = [h for _, h in self.pol.candidate_gpus(sc, job, self.slots.occ)]
        assert got == want
        self.counts["gpus_checked"] += len(sc.state.gpus)


def _stream(seed: int) -> tuple[list[TraceJob], WorldConfig, int]:
    """A random bursty stream: 30-70 short jobs of random workloads (so random memories)
    arriving within 10-40 s on 4-12 GPUs, and a random ``burst_jobs``."""
    rng = random.Random(seed)
    names = sorted(catalogue())
    n = rng.randint(30, 70)
    spread = rng.uniform(10.0, 40.0)
    trace = [TraceJob(f"j{i:03d}", spread * i / n + rng.uniform(0.0, 0.5),
                      rng.uniform(8.0, 40.0), rng.choice(names)) for i in range(n)]
    trace.sort(key=lambda t: t.submit_s)
    cfg = WorldConfig(n_gpus=rng.randint(4, 12), restart_s=3.0, profile_s_per_level=1.0,
                      reconfig_s=0.5, declare_work=False)
    return trace, cfg, rng.choice((2, 3, 3, 4))


def _run(seed: int) -> dict[str, int]:
    trace, cfg, burst_jobs = _stream(seed)
    est = build_policy("miso+", trace, cfg, 1).estimator
    pol = MisoPlus(restart_s=60.0, estimator=est, burst_jobs=burst_jobs,
                   profile_seconds_per_level=cfg.profile_s_per_level)
    pol.bursts = CheckedBurst(pol, pol.bursts.opts)
    Simulator(pol, trace, cfg, seed=seed).run()
    return pol.bursts.counts  # type: ignore[attr-defined, no-any-return]


def test_index_answers_as_the_scan_on_random_bursts() -> None:
    total = {"moved": 0, "stay": 0, "gpus_checked": 0}
    for seed in range(12):
        for k, v in _run(seed).items():
            total[k] += v
    # The streams reach both answers (else the comparison above proved nothing).
    assert total["moved"] >= 10 and total["stay"] >= 10, total


def test_open_fits_are_the_fit_classes_with_a_free_slot() -> None:
    trace, cfg, _ = _stream(3)
    est = build_policy("miso+", trace, cfg, 1).estimator
    pol = MisoPlus(restart_s=60.0, estimator=est)
    seen = 0

    class Probe(Burst):
        def landing_gpu(self, sc: Scratch, g: str, job: str, held: str | None) -> str:
            nonlocal seen
            for h, gs in sc.state.gpus.items():
                for f in fit_classes(gs.geom):
                    opened = f in freeslots.open_fits(sc, h)
                    assert opened == (freeslots.free_slots(sc, h, f) > 0)
                    seen += opened
            return super().landing_gpu(sc, g, job, held)

    pol.bursts = Probe(pol, pol.bursts.opts)
    Simulator(pol, trace, cfg, seed=1).run()
    assert seen > 0


def test_the_comparison_catches_a_wrong_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison with the scan fails when the index misses a GPU with a free slot."""
    monkeypatch.setattr(freeslots, "open_fits", lambda sc, g: ())  # a broken index: empty
    with pytest.raises(AssertionError):
        for seed in range(12):
            _run(seed)


def _run_plain(seed: int) -> None:
    trace, cfg, burst_jobs = _stream(seed)
    est = build_policy("miso+", trace, cfg, 1).estimator
    pol = MisoPlus(restart_s=60.0, estimator=est, burst_jobs=burst_jobs,
                   profile_seconds_per_level=cfg.profile_s_per_level)
    Simulator(pol, trace, cfg, seed=seed).run()


@pytest.mark.parametrize("model", ["A100-40GB", "H100-80GB"])
def test_room_beside_never_rules_out_a_layout_the_optimizer_finds(model: str) -> None:
    """``fits_beside_pinned`` skips the solve when :func:`room_beside` says no layout holds
    the pinned instances, the other residents and the newcomer; on random pinned instances
    (from valid layouts), other residents and newcomers (prior speeds of random memories),
    the optimizer then fails too; and the rule does skip some solves that fail."""
    from miso.mig import enumerate_layouts, geometry
    from miso.optimize import OptimizerError, optimizer_for
    from miso.sched.speeds import prior_speeds

    geom = geometry(model)
    opt = optimizer_for(geom)
    layouts = enumerate_layouts(geom)
    mems = sorted({p.memory_gib for p in geom.profiles})
    rng = random.Random(7)
    skipped = 0
    for _ in range(400):
        lay = list(rng.choice(layouts))
        pins = rng.sample(lay, rng.randint(1, len(lay)))
        speeds: dict[str, dict[str, float]] = {}
        current = {}
        for i, pl in enumerate(pins):
            mem = min(m for m in mems if m >= 1.0)  # fits every profile: any pinned slice
            speeds[f"p{i}"] = prior_speeds(geom, mem)
            current[f"p{i}"] = pl
        for i in range(rng.randint(0, 2)):  # residents placed, no instance yet
            speeds[f"u{i}"] = prior_speeds(geom, rng.choice(mems) * rng.uniform(0.3, 1.0))
        new = prior_speeds(geom, rng.choice(mems) * rng.uniform(0.3, 1.0))
        speeds["new"] = new
        room = freeslots.room_beside(geom, frozenset(pins))
        may = any(room.get(q, 0) >= len(speeds) for q in new)
        try:
            opt.solve(speeds, current=current, pinned=set(current))
            solved = True
        except OptimizerError:
            solved = False
        assert may or not solved, (pins, speeds)
        skipped += not may
    assert skipped >= 20


def test_the_room_rule_skips_only_failing_solves_on_random_bursts(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Every solve the room rule skips (``GpuChoice.may_fit`` false) is run here and must fail
    (random bursty streams)."""
    from miso.optimize import OptimizerError, optimizer_for
    from miso.sched.policies import placing

    calls = {"skip": 0, "fit": 0}
    may_fit = placing.GpuChoice.may_fit

    def counted(self: placing.GpuChoice, sc: Scratch, g: str, jobs: list[str],
                pinned: set[str], job: str) -> bool:
        got = may_fit(self, sc, g, jobs, pinned, job)
        calls["fit" if got else "skip"] += 1
        if not got:  # the solve fits_beside_pinned skips: no layout holds the mix
            gs = sc.state.gpus[g]
            sp = self.pol.speeds(gs.geom, sc, [*jobs, job])
            current = {j: pl for j, pl in gs.assignment.items() if j in sp}
            with pytest.raises(OptimizerError):
                optimizer_for(gs.geom).solve(sp, current=current, pinned=pinned)
        return got

    monkeypatch.setattr(placing.GpuChoice, "may_fit", counted)
    for seed in range(12):
        _run_plain(seed)
    assert calls["skip"] > 0 and calls["fit"] > 0, calls
