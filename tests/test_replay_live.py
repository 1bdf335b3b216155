"""One stream, two drivers (issue 17): the demo's kind of stream run on the emulated cluster
(real agent and job processes, in-process controller) and replayed in the simulator with the
same physics (2 s restarts, 1 s profiling levels, 0.5 s reconfiguration) and the same
knowledge (jobs declare no work at submission; miso+ is told no restart cost, it starts from
its default and measures) gives miso+ about the same restarts per job and the same JCT ratio
against NoPart, and each policy about the same average JCT. Marked slow (two live runs of the
demo's stream, about three minutes); CI runs it (.ci/run)."""

from __future__ import annotations

import inspect
import shutil
import tempfile
import time
from typing import Any

import pytest

from miso.cli.demo_cluster import DEMO_RESTART_S, DemoLocal, demo_jobs, demo_trace, summarize
from miso.sched.policies import MisoPlus
from miso.sim.run import run_policy
from miso.sim.world import WorldConfig

GPUS = 4
#: Tolerances: live timing on a loaded machine (process starts, polling every 0.5 s) and the
#: simulator's coarse MPS model. Live, a GPU's next plan waits until its previous one is
#: carried out, so arrivals meanwhile share one plan and restart fewer jobs: measured
#: 2026-12-01 on the demo's stream, live 0.85-1.0 restarts per job, simulated 1.55; JCT
#: live 35.88 s vs simulated 36.11 s (miso+), 54.37 vs 53.22 (NoPart), ratios 0.660 / 0.679.
RATIO_TOL = 0.15
RESTARTS_TOL = 0.75
#: Live against simulated average JCT, per policy (the issue's bound: 15 %).
JCT_TOL = 0.15
#: What miso+ assumes a restart costs before it measures one: the live controller tells it
#: nothing (``miso demo`` passes no restart cost), so it starts from its default.
TOLD_RESTART_S = inspect.signature(MisoPlus).parameters["restart_s"].default


def live(policy: str, stream: list[tuple[float, str, list[str]]]) -> dict[str, Any]:
    """Run the stream on a fresh in-process emulated cluster, as ``miso demo --no-ray``."""
    d = tempfile.mkdtemp(prefix="miso-replay-")
    cfg = {"policy": policy, "profile_seconds_per_level": 1.0, "checkpoint_timeout": 10.0,
           "estimator": "auto"}
    cluster = DemoLocal(d, GPUS, "A100-40GB", cfg)
    policy = cluster.c.controller.policy  # type: ignore[union-attr]
    try:
        t0 = time.time()
        pending = list(stream)
        while True:
            now = time.time() - t0
            while pending and pending[0][0] <= now:
                _, name, cmd = pending.pop(0)
                cluster.submit(cmd, name)
            jobs = cluster.status()["jobs"]
            if not pending and all(j["state"] in ("finished", "failed", "cancelled")
                                   for j in jobs):
                out = summarize(jobs)
                restarts = getattr(policy, "restarts", None)
                total, n = restarts.stats if restarts is not None else (0.0, 0.0)
                out["restart_cost_s"] = total / n if n else None  # as miso+ measured it
                return out
            assert now < 300, "the live run did not end"
            time.sleep(0.25)
    finally:
        cluster.close()
        shutil.rmtree(d, ignore_errors=True)


def simulated(policy: str, stream: list[tuple[float, str, list[str]]],
              restart_s: float = DEMO_RESTART_S) -> dict[str, Any]:
    """The stream in the simulator, the policy knowing what it knows live; a restart costs
    ``restart_s`` (live: the cost miso+ measured, the job's 2 s warm-up plus stopping,
    relaunching and its first report)."""
    cfg = WorldConfig(n_gpus=GPUS, restart_s=restart_s, profile_s_per_level=1.0,
                      reconfig_s=0.5, declare_work=False)
    told = {"restart_s": TOLD_RESTART_S} if policy == "miso+" else {}
    r = run_policy(policy, demo_trace(stream), cfg, seed=1, **told)
    return {"avg_jct_s": float(r.jct.mean()), "restarts_per_job": float(r.restarts.mean())}


@pytest.mark.slow
def test_replay__simulator_and_emulated_cluster_agree_on_misoplus_vs_nopart() -> None:
    stream = demo_jobs(20, seed=0)  # the demo's own stream (`miso demo`)
    lp, ln = live("miso+", stream), live("nopart", stream)
    cost = lp["restart_cost_s"] or DEMO_RESTART_S
    sp, sn = simulated("miso+", stream, cost), simulated("nopart", stream, cost)
    assert lp["completed"] == ln["completed"] == len(stream)
    live_ratio = lp["avg_jct_s"] / ln["avg_jct_s"]
    sim_ratio = sp["avg_jct_s"] / sn["avg_jct_s"]
    print(f"live {lp} / {ln}; simulated {sp} / {sn}; ratios {live_ratio:.3f} {sim_ratio:.3f}")
    assert live_ratio == pytest.approx(sim_ratio, abs=RATIO_TOL)
    assert lp["restarts_per_job"] == pytest.approx(sp["restarts_per_job"], abs=RESTARTS_TOL)
    assert lp["avg_jct_s"] == pytest.approx(sp["avg_jct_s"], rel=JCT_TOL)
    assert ln["avg_jct_s"] == pytest.approx(sn["avg_jct_s"], rel=JCT_TOL)
    assert ln["restarts_per_job"] == sn["restarts_per_job"] == 0
