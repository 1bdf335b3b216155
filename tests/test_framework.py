"""The policy framework (issue 27): a new placement rule is one filter class plus one line
in a profile, and the same fit test serves placement and preemption."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import pytest

from miso.sched.decisions import PlaceJob
from miso.sched.experiments import ToldRestartPrice
from miso.sched.policies import POLICIES, PROFILES
from miso.sched.policies.framework import Cycle
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.run import run_policy
from miso.sim.traces import poisson_jobs
from miso.sim.world import WorldConfig


@dataclass(frozen=True)
class NeverOn:
    """A new placement rule: never place on a GPU named in ``gpus``."""

    gpus: frozenset[str]
    name: ClassVar[str] = "never-on"

    def active(self, cy: Cycle) -> bool:
        return True

    def reject(self, cy: Cycle, job: str, gpu: str, residents: Sequence[str]) -> str | None:
        return f"{gpu} is excluded" if gpu in self.gpus else None


@pytest.mark.parametrize("base", ["nopart", "miso", "miso+"])
def test_a_new_placement_rule_is_one_plugin_and_one_line(base: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POLICIES, "test-never", PROFILES[base].plus(
        name="test-never", filters=(NeverOn(frozenset({"gpu0"})),)))
    jobs = poisson_jobs(30, seed=4, mean_interarrival_s=40.0)
    cfg = WorldConfig(n_gpus=3)
    kw = {} if base == "nopart" else {"estimator": __import__(
        "miso.sched.estimators", fromlist=["x"]).make_estimator("true", seed=1)}
    r = run_policy("test-never", jobs, cfg, 1, record=True, **kw)
    placed = [d.gpu for _, d in r.log if isinstance(d, PlaceJob)]
    assert placed and "gpu0" not in placed
    assert len(r.jct) == len(jobs)   # every job still ends
    base_run = run_policy(base, jobs, cfg, 1, record=True, **kw)
    assert "gpu0" in [d.gpu for _, d in base_run.log if isinstance(d, PlaceJob)]


def test_preemption_respects_the_profile_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preemption tests fit with the same filters as placement: high-priority jobs never
    preempt their way onto an excluded GPU."""
    from dataclasses import replace

    from miso.sched.decisions import RequeueJob
    from miso.sched.tenancyconfig import HIGH

    jobs = [replace(j, priority=HIGH if i % 4 == 3 else 0)
            for i, j in enumerate(poisson_jobs(40, seed=5, mean_interarrival_s=20.0))]
    cfg = WorldConfig(n_gpus=2)
    ten = TenancyConfig(fair_share=False, preempt=True, min_run_s=0.0)
    monkeypatch.setitem(POLICIES, "test-never", PROFILES["nopart"].plus(
        name="test-never", filters=(NeverOn(frozenset({"gpu1"})),)))
    r = run_policy("test-never", jobs, cfg, 1, record=True, tenancy=ten)
    log = [d for _, d in r.log]
    assert not any(isinstance(d, PlaceJob) and d.gpu == "gpu1" for d in log)
    base = [d for _, d in run_policy("nopart", jobs, cfg, 1, record=True, tenancy=ten).log]
    assert any(isinstance(d, RequeueJob) and "preempted" in d.reason for d in base)


def test_profiles_are_the_policy_table() -> None:
    for name, prof in PROFILES.items():
        pol = POLICIES[name](**({} if name in ("nopart", "optsta", "mps", "oracle") else {
            "estimator": __import__("miso.sched.estimators",
                                    fromlist=["x"]).make_estimator("true", seed=1)}))
        assert pol.name == name and pol.profile is prof
        assert pol.filters == prof.filters and pol.post_filters == prof.post_filters


def test_misoplus_preemption_prices_victims_at_its_restart_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Preemption prices miso+'s victims at the policy's restart price (here the configured
    one, nothing learned), not the post-filter's default (60 s) for a policy without one."""
    from dataclasses import replace

    from miso.sched.estimators import make_estimator
    from miso.sched.policies import preempt
    from miso.sched.tenancyconfig import HIGH

    seen: list[float] = []
    cost = preempt.victim_cost

    def recording(sc, job, now, restart_s):  # noqa: ANN001, ANN202
        seen.append(restart_s)
        return cost(sc, job, now, restart_s)

    monkeypatch.setattr(preempt, "victim_cost", recording)
    jobs = [replace(j, priority=HIGH if i % 4 == 3 else 0)
            for i, j in enumerate(poisson_jobs(40, seed=5, mean_interarrival_s=20.0))]
    ten = TenancyConfig(fair_share=False, preempt=True, min_run_s=0.0)
    run_policy("miso+", jobs, WorldConfig(n_gpus=2, restart_s=300.0), 1, tenancy=ten,
               restart_s=300.0, estimator=make_estimator("true", seed=1),
               restart_costs=ToldRestartPrice)
    assert seen and set(seen) == {300.0}


def test_misoplus_prices_victims_at_its_learned_restart_costs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One restart price: preemption charges each victim what the policy's plans charge it
    (its learned cost, else the mean learned, else ``restart_s``), which here moves off the
    configured 300 s once restarts are measured (the world's restarts take 30 s)."""
    from dataclasses import replace

    from miso.sched.policies import preempt
    from miso.sched.tenancyconfig import HIGH
    from miso.sim.engine import Simulator
    from miso.sim.run import build_policy

    jobs = [replace(j, priority=HIGH if i % 4 == 3 else 0)
            for i, j in enumerate(poisson_jobs(60, seed=5, mean_interarrival_s=20.0))]
    cfg = WorldConfig(n_gpus=2, restart_s=30.0)
    pol = build_policy("miso+", jobs, cfg, 1, restart_s=300.0)
    seen: list[tuple[float, float]] = []
    cost = preempt.victim_cost

    def recording(sc, job, now, restart_s):  # noqa: ANN001, ANN202
        seen.append((restart_s, pol.restarts.cost(job)))
        return cost(sc, job, now, restart_s)

    monkeypatch.setattr(preempt, "victim_cost", recording)
    Simulator(pol, jobs, cfg, seed=1,
              tenancy=TenancyConfig(fair_share=False, preempt=True, min_run_s=0.0)).run()
    assert seen and all(charged == learned for charged, learned in seen)
    assert any(charged < 300.0 for charged, _ in seen)  # learned, not the configured prior
