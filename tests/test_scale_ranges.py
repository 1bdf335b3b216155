"""The scale harness's range check (benchmarks/scale/live.py): a figure out of its checked-in
bounds fails the run; the CI size has exact bounds on lost and twice-run jobs."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def _live():  # noqa: ANN202
    return load_script("scale_live", ROOT / "benchmarks/scale/live.py")


def test_a_figure_outside_its_bounds_or_missing_fails() -> None:
    live = _live()
    res = {"lost": 0, "submits_per_s": 40.0, "replan": {"replan_s": 3.0}}
    assert live.check(res, {"lost": [0, 0], "submits_per_s": [10, None],
                            "replan.replan_s": [None, 10]}) == []
    bad = live.check({**res, "lost": 1, "submits_per_s": 5.0},
                     {"lost": [0, 0], "submits_per_s": [10, None], "twice": [0, 0]})
    assert bad == ["lost = 1 outside [0, 0]", "submits_per_s = 5.0 outside [10, None]",
                   "twice: missing"]


def test_the_ci_size_is_bounded_exactly_on_lost_and_twice() -> None:
    ranges = json.loads((ROOT / "benchmarks/scale/ranges.json").read_text())
    ci = ranges["64x1000"]
    assert ci["lost"] == [0, 0] and ci["twice"] == [0, 0] and ci["submitted"] == [1000, 1000]
    for key in ("submits_per_s", "decision_p99_s", "status_p99_s"):
        assert key in ci


def test_an_arrival_rate_spreads_the_same_jobs_over_time_and_is_reported() -> None:
    live = _live()
    cfg = json.loads((ROOT / "benchmarks/scale/config.json").read_text())
    burst = live.job_mix({**cfg, "arrival_per_s": 0}, 500)
    paced = live.job_mix({**cfg, "arrival_per_s": 60.0}, 500)
    assert live.offered_rate(burst) is None  # all at once: the clients' own pace
    assert {j["at"] for j in burst} == {0.0}
    # the same jobs (workload, work, owner), offered over ~500/60 s in order
    assert [(j["workload"], j["work_s"], j["owner"]) for j in burst] == \
        [(j["workload"], j["work_s"], j["owner"]) for j in paced]
    ats = [j["at"] for j in paced]
    assert ats == sorted(ats) and ats[0] == 0.0
    assert 45 <= live.offered_rate(paced) <= 75
