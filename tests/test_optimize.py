"""The exact optimizer against a brute force over all layouts and permutations."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miso.bruteforce import brute_force
from miso.mig import Placement, enumerate_layouts, geometry, is_valid
from miso.optimfeasible import FeasibilityMemo
from miso.optimize import (
    Objective,
    OptimizerError,
    PartitionOptimizer,
    optimizer_for,
    remembering_optimizer,
)

MODELS = ["A100-40GB", "A30-24GB", "H100-80GB", "RTX-PRO-6000"]


@st.composite
def problems(draw, model: str):
    g = geometry(model)
    opt = optimizer_for(g)
    n = draw(st.integers(1, opt.max_jobs))
    names = [p.name for p in g.profiles]
    speeds = {}
    for i in range(n):
        row = {}
        for name in names:
            if draw(st.booleans()) or draw(st.booleans()):  # ~75 % of profiles fit
                row[name] = draw(st.floats(0.01, 1.5, allow_nan=False))
        speeds[f"j{i}"] = row
    # A random current assignment drawn from some valid layout, for some of the jobs.
    lays = [lay for lay in enumerate_layouts(g) if len(lay) >= 1]
    lay = draw(st.sampled_from(lays))
    current = {}
    for j, pl in zip(speeds, lay, strict=False):
        if draw(st.booleans()):
            current[j] = pl
    return g, speeds, current


def _check(g, speeds, current, objective):
    opt = optimizer_for(g)
    ref = brute_force(g, speeds, current=current, objective=objective, restart_penalty=0.1)
    try:
        sol = opt.solve(speeds, current=current, objective=objective, restart_penalty=0.1)
    except OptimizerError:
        assert ref == -math.inf
        return
    assert ref > -math.inf
    assert sol.objective == pytest.approx(ref, abs=1e-9)
    # The answer is a real layout with one instance per job.
    assert is_valid(g, sol.layout)
    assert len(sol.layout) == len(speeds)
    assert sorted(sol.assignment.values()) == sorted(sol.layout)
    # Every job sits on a profile it fits, and the reported throughput matches.
    assert all(pl.profile in speeds[j] for j, pl in sol.assignment.items())
    thr = sum(speeds[j][pl.profile] for j, pl in sol.assignment.items())
    assert sol.throughput == pytest.approx(thr)
    assert set(sol.restarted) | set(sol.kept) == set(current)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("objective", list(Objective))
def test_matches_brute_force(model, objective):
    @settings(max_examples=400 if model == "A100-40GB" else 200, deadline=None,
              suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(problems(model))
    def run(problem):
        g, speeds, current = problem
        _check(g, speeds, current, objective)

    run()


def test_ties_prefer_fewest_restarts():
    g = geometry("A100-40GB")
    # All jobs equally fast everywhere: every 3-job layout of the same multiset ties.
    speeds = {j: {p.name: 0.5 for p in g.profiles} for j in "abc"}
    current = {"a": Placement(0, "2g.10gb"), "b": Placement(4, "3g.20gb"),
               "c": Placement(2, "2g.10gb")}
    sol = optimizer_for(g).solve(speeds, current=current)
    assert sol.restarted == ()
    assert sol.assignment == current


def test_restart_aware_keeps_jobs_when_gain_is_small():
    g = geometry("A100-40GB")
    opt = optimizer_for(g)
    speeds = {"a": {"7g.40gb": 1.0, "4g.20gb": 0.60, "3g.20gb": 0.55},
              "b": {"7g.40gb": 1.0, "4g.20gb": 0.62, "3g.20gb": 0.56}}
    current = {"a": Placement(0, "4g.20gb"), "b": Placement(4, "3g.20gb")}
    # Swapping gains 0.01 in throughput; a 0.1 penalty per restart outweighs it.
    assert set(opt.solve(speeds, current=current).restarted) == {"a", "b"}
    sol = opt.solve(speeds, current=current, objective="restart-aware", restart_penalty=0.1)
    assert sol.restarted == () and sol.throughput == pytest.approx(1.16)


def test_fairness_spreads_speed():
    g = geometry("A100-40GB")
    opt = optimizer_for(g)
    # Job a gains a lot from 4g, b little; fairness still avoids starving either.
    speeds = {"a": {"4g.20gb": 0.9, "3g.20gb": 0.5, "2g.10gb": 0.2, "1g.5gb": 0.1},
              "b": {"4g.20gb": 0.9, "3g.20gb": 0.8, "2g.10gb": 0.6, "1g.5gb": 0.3}}
    thr = opt.solve(speeds)
    fair = opt.solve(speeds, objective="fairness")
    assert fair.objective == pytest.approx(math.log(0.9) + math.log(0.8))
    assert thr.throughput >= fair.throughput


def test_single_job_gets_the_whole_gpu():
    g = geometry("A100-40GB")
    sol = optimizer_for(g).solve({"a": {p.name: 0.1 * (i + 1) for i, p in
                                        enumerate(reversed(g.profiles))}})
    assert sol.layout == (Placement(0, "7g.40gb"),)


def test_errors_are_clear():
    g = geometry("A100-40GB")
    opt = optimizer_for(g)
    with pytest.raises(OptimizerError, match="at most 7"):
        opt.solve({f"j{i}": {"1g.5gb": 0.2} for i in range(8)})
    with pytest.raises(OptimizerError, match="fits no MIG profile"):
        opt.solve({"a": {}})
    with pytest.raises(OptimizerError, match="no valid A100-40GB layout"):
        opt.solve({j: {"7g.40gb": 1.0} for j in "ab"})
    with pytest.raises(OptimizerError, match=r"outside \(0, 1.5\]"):
        opt.solve({"a": {"7g.40gb": 2.0}})
    with pytest.raises(OptimizerError, match=r"outside \(0, 1.5\]"):
        opt.solve({"a": {"7g.40gb": float("nan")}})
    with pytest.raises(OptimizerError, match="not one of"):
        opt.solve({"a": {"9g.90gb": 0.5}})


def test_try_solve_answers_none_where_solve_raises() -> None:
    opt = optimizer_for(geometry("A100-40GB"))
    assert opt.try_solve({j: {"7g.40gb": 1.0} for j in "ab"}) is None  # no layout holds both
    assert opt.try_solve({"a": {"7g.40gb": 2.0}}) is None  # an invalid speed
    speeds = {"a": {"4g.20gb": 0.6, "3g.20gb": 0.5}, "b": {"3g.20gb": 0.5, "4g.20gb": 0.7}}
    got = opt.try_solve(speeds, objective="throughput")
    assert got is not None and got.assignment == opt.solve(speeds).assignment
    assert got.throughput == pytest.approx(1.2)


@pytest.mark.parametrize("model", ["A100-40GB", "A30-24GB"])
def test_per_job_penalties_and_pinned_match_brute_force(model):
    """Per-job restart costs and pinned jobs (hard constraints) agree with the brute force, and
    a pinned job never leaves its instance."""

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(problems(model), st.data())
    def run(problem, data):
        g, speeds, current = problem
        pen = {j: data.draw(st.floats(0.0, 0.8)) for j in current}
        pinned = {j for j in current if data.draw(st.booleans())}
        ref = brute_force(g, speeds, current=current, objective="restart-aware",
                          restart_penalty=pen, pinned=pinned)
        try:
            sol = optimizer_for(g).solve(speeds, current=current, objective="restart-aware",
                                         restart_penalty=pen, pinned=pinned)
        except OptimizerError:
            assert ref == -math.inf
            return
        assert sol.objective == pytest.approx(ref, abs=1e-9)
        assert all(sol.assignment[j] == current[j] for j in pinned)
        assert is_valid(g, sol.layout)

    run()


@pytest.mark.parametrize("model", ["A100-40GB", "H100-80GB"])
def test_the_memo_answers_as_a_fresh_solve(model):
    """The remembering optimizer's memo gives, asked twice, what a fresh solve gives (the same
    solution or the same error), and an answer handed out cannot change a later one."""
    fresh = PartitionOptimizer(geometry(model))

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(problems(model), st.data())
    def run(problem, data):
        g, speeds, current = problem
        pen = {j: data.draw(st.floats(0.0, 0.8)) for j in current}
        pinned = {j for j in current if data.draw(st.booleans())}
        kw = {"current": current, "objective": "restart-aware", "restart_penalty": pen,
              "pinned": pinned}
        try:
            want = fresh.solve(speeds, **kw)
        except OptimizerError as e:
            for _ in range(2):
                with pytest.raises(type(e), match="^" + re.escape(str(e)) + "$"):
                    remembering_optimizer(g).solve(speeds, **kw)
            return
        first = remembering_optimizer(g).solve(speeds, **kw)
        first.assignment.clear()  # a caller's change to its copy
        assert remembering_optimizer(g).solve(speeds, **kw) == want

    run()


@pytest.mark.parametrize("model", ["A100-40GB", "H100-80GB"])
def test_few_pairs_scored_in_python_as_numpy_scores_them(model, monkeypatch):
    """A few candidate pairs are scored in plain Python; the answer is the vectorised one to
    the last bit (objective, layout, assignment)."""
    import miso.optimpairs as optimpairs_module

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(problems(model), st.data())
    def run(problem, data):
        g, speeds, current = problem
        pen = {j: data.draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])) for j in current}
        kw = {"current": current, "objective": "restart-aware", "restart_penalty": pen}
        got = []
        for few in (16, -1):  # -1: every case vectorised
            monkeypatch.setattr(optimpairs_module, "FEW_PAIRS", few)
            try:
                sol = optimizer_for(g).solve(speeds, **kw)
                got.append((repr(sol.objective), sol.layout, sol.assignment))
            except OptimizerError as e:
                got.append(str(e))
        assert got[0] == got[1]

    run()


@pytest.mark.parametrize("model", ["A100-40GB", "H100-80GB", "A30-24GB"])
def test_one_or_two_jobs_solved_in_python_as_numpy_solves_them(model):
    """One or two jobs are solved on Python lists (``_Small``); every answer (objective to
    the bit, layout, assignment, restarts, or the error's words) is the numpy path's, for
    every objective, per-job penalties and pinned jobs."""
    g = geometry(model)
    numpy_only = PartitionOptimizer(g)
    numpy_only._small = {}
    small = optimizer_for(g)
    assert set(small._small) == {1, 2}

    @settings(max_examples=200, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(problems(model), st.data())
    def run(problem, data):
        g, speeds, current = problem
        speeds = dict(list(speeds.items())[:data.draw(st.integers(1, 2))])
        current = {j: pl for j, pl in current.items() if j in speeds}
        objective = data.draw(st.sampled_from(list(Objective)))
        pen = {j: data.draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])) for j in current}
        pinned = {j for j in current if data.draw(st.booleans())}
        kw = {"current": current, "objective": objective, "restart_penalty": pen,
              "pinned": pinned}
        got = []
        for opt in (small, numpy_only):
            try:
                sol = opt.solve(speeds, **kw)
                got.append((sol.objective.hex(), sol.throughput.hex(), sol.layout,
                            sol.assignment, sol.restarted, sol.kept))
            except OptimizerError as e:
                got.append(str(e))
        assert got[0] == got[1]

    run()


@pytest.mark.parametrize("model", MODELS)
def test_holds_answers_as_a_fresh_solve(model):
    """:meth:`FeasibilityMemo.holds` remembers feasibility by structure; over many random
    mixes of few memory classes (so most questions hit the memo), each with its own speeds,
    job order, unpinned instances and pinned instances, its answer is a fresh solve's. A key
    that left out what matters (a pinned job's instance, a job's profiles, the job count)
    would hand out an answer remembered for another structure."""
    import random

    g = geometry(model)
    cached, fresh = FeasibilityMemo(PartitionOptimizer(g)), PartitionOptimizer(g)
    by_mem = sorted(g.profiles, key=lambda p: p.memory_gib)
    classes = [tuple(p.name for p in by_mem if p.memory_gib >= m)
               for m in sorted({p.memory_gib for p in by_mem})[:3]]
    lays = [lay for lay in enumerate_layouts(g) if lay]
    rnd = random.Random(32)
    answers = {True: 0, False: 0}
    for _ in range(3000):
        n = rnd.randint(1, cached.opt.max_jobs)
        jobs = [f"j{i}" for i in rnd.sample(range(20), n)]
        speeds = {j: {p: rnd.uniform(0.05, 1.5) for p in rnd.choice(classes)} for j in jobs}
        lay = list(rnd.choice(lays))
        rnd.shuffle(lay)
        current = {j: pl for j, pl in zip(jobs, lay, strict=False) if rnd.random() < 0.7}
        pinned = {j for j in current if rnd.random() < 0.5} | ({"gone"} if rnd.random() < 0.1
                                                               else set())
        want = fresh.try_solve(speeds, current=current, pinned=pinned) is not None
        assert cached.holds(speeds, current=current, pinned=pinned) is want
        answers[want] += 1
    assert min(answers.values()) > 100  # both answers, many times
    assert len(cached.answers) < 2000  # most questions were answered from the memo
    # A bad speed is not remembered: the solve rejects it whatever the structure.
    assert FeasibilityMemo(fresh).holds({"a": {classes[0][0]: 2.0}}) is False
    assert FeasibilityMemo(fresh).holds({"a": {classes[0][0]: 1.0}}) is True
