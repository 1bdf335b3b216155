"""One service run, two drivers (issue 29): a ramp 1x -> 3x -> 1x of one replica's capacity
through the router on an in-process emulated cluster (real router, replica and load-generator
processes), then the same arrivals replayed in simulation (:mod:`miso.sim.servicereplay`: the
same planner, the emulated server's latency model). The SLO attainment agrees within a point
and the ready replicas within one most of the time. Slow (a 90-s ramp, ~2 minutes)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

from miso.mig import gpu_model
from miso.sched.services import ServiceSpec
from miso.sim.servicereplay import replay

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "serve"))
import ramp_local  # noqa: E402

SLO_MS = 100.0
GPUS = 4
#: The live run's attainment against the replay's (the issue: within 1 point).
ATTAINMENT_TOL = 0.01
#: Share of seconds in which live and replayed ready replicas differ by at most one.
REPLICAS_WITHIN_ONE = 0.8


@pytest.mark.slow
def test_live_ramp_agrees_with_its_simulated_replay(tmp_path: Path) -> None:
    live = ramp_local.run(tmp_path, duration=90.0, points="1,3,1", training_jobs=0, gpus=GPUS,
                          slo_ms=SLO_MS, server_args=("--slowdown", "1000"),
                          keep_samples=True)
    assert live["errors"] == 0, live
    assert live["scale_outs"] >= 1, live
    spec = ServiceSpec("bars-svc", "", "resnet50", SLO_MS, min_replicas=1, max_replicas=8)
    sim = replay(live["sent_s"], spec, gpu_model=live["gpu_model"], profile=live["profile"],
                 capacity_rps=live["base_rps"], slowdown=live["slowdown"],
                 ready_delay_s=statistics.median(live["ready_delays_s"] or [2.0]),
                 slots=GPUS * len(gpu_model(live["gpu_model"]).profile(live["profile"]).starts))
    live_n = np.array([n for _, n, _ in live["timeline"]])
    sim_n = np.array([n for _, n in sim.replicas])
    k = min(len(live_n), len(sim_n))
    within = float((np.abs(live_n[:k] - sim_n[:k]) <= 1).mean())
    print(f"live attainment {live['attainment']}, replayed {sim.attainment(SLO_MS):.5f}; "
          f"ready replicas within one {within:.3f} of {k} s; live max {live_n.max()}, "
          f"replayed max {sim_n.max()}; scale-outs {live['scale_outs']}, "
          f"scale-ins {live['scale_ins']}; base {live['base_rps']}/s on {live['profile']}")
    assert abs(live["attainment"] - sim.attainment(SLO_MS)) <= ATTAINMENT_TOL, \
        (live["attainment"], sim.attainment(SLO_MS))
    assert within >= REPLICAS_WITHIN_ONE, (within, live_n.tolist(), sim_n.tolist())


def test_replay_scales_with_the_rate_and_respects_the_slots() -> None:
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / 30.0, 1800))  # ~30/s for ~60 s
    spec = ServiceSpec("s", "", "resnet50", SLO_MS, min_replicas=1, max_replicas=8)
    kw = {"gpu_model": "A100-40GB", "profile": "7g.40gb", "capacity_rps": 11.7,
          "slowdown": 1000.0, "ready_delay_s": 3.0}
    free = replay(arrivals, spec, **kw)
    capped = replay(arrivals, spec, slots=2, **kw)
    assert max(n for _, n in free.replicas) >= 3  # 30/s x 1.2 over 11.7/s a replica
    assert max(n for _, n in capped.replicas) == 2
    assert capped.attainment(SLO_MS) < free.attainment(SLO_MS)
