"""``miso simulate``'s owners and fairness: the jobs' owners and priorities with the tenancy
config of a run (``--tenants``, ``--fair-share``, ...), the fairness figures
(``--fairness-report``: :mod:`miso.sim.fairness`) and the per-owner results it prints.
Used by :mod:`miso.cli.simulate`."""

from __future__ import annotations

import math
from typing import Any

from miso.cli.text import fail, make_console


def tenancy_setup(tjobs: list, tenants: int | None, skew: float | None, fair_share: bool,
             half_life: float, priority_frac: float, preempt: bool, min_run_s: float,
             seed: int, reclaim: bool = True, demand_per_job: float = 0.5,
             fairness_price: float | None = None
             ) -> tuple[list, object]:
    """The jobs with owners and priorities, and the tenancy config (None when the run has
    neither owners nor priorities nor fair share: the plain FIFO queue)."""
    from miso.sched.tenancyconfig import TenancyConfig
    from miso.sim.traces import assign_tenants, mark_priority

    if tenants is not None:
        tjobs = assign_tenants(tjobs, tenants, 1.0 / tenants if skew is None else skew,
                               seed=seed)
    if priority_frac > 0:
        tjobs = mark_priority(tjobs, priority_frac, seed=seed)
    if not (fair_share or preempt or any(j.owner or j.priority for j in tjobs)):
        return tjobs, None
    return tjobs, TenancyConfig(fair_share=fair_share, half_life_s=half_life, preempt=preempt,
                                min_run_s=min_run_s, reclaim=reclaim,
                                demand_per_job=demand_per_job, fairness_price=fairness_price)


def fair_price_option(fair_share: bool, demand_per_job: float | None,
                      fairness_price: float | None) -> float | None:
    """The fairness price a run uses: ``--fairness-price`` (default
    :data:`~miso.sched.fairprice.DEFAULT_PRICE`), None with a fixed ``--demand-per-job``;
    one-line failures for a value out of range or both given."""
    from miso.sched.fairprice import DEFAULT_PRICE
    from miso.sched.tenancyconfig import MAX_FAIRNESS_PRICE

    if demand_per_job is not None and not (math.isfinite(demand_per_job)
                                           and 0 < demand_per_job <= 1):
        fail(f"--demand-per-job must be in (0, 1], not {demand_per_job}")
    if fairness_price is not None and not (math.isfinite(fairness_price)
                                           and 0 <= fairness_price <= MAX_FAIRNESS_PRICE):
        fail(f"--fairness-price must be a share from 0 to {MAX_FAIRNESS_PRICE:g} (0.05: 5 %), "
             f"not {fairness_price}")
    if fairness_price is not None and demand_per_job is not None:
        fail("--fairness-price and --demand-per-job: give one (a price lets fair slices "
             "follow the load; --demand-per-job fixes their cap)")
    if fairness_price is not None and not fair_share:
        fail("--fairness-price needs --fair-share")
    if demand_per_job is not None or not fair_share:
        return None
    return DEFAULT_PRICE if fairness_price is None else fairness_price


def add_fairness(summary: dict, raw: dict, pols: list[str], tjobs: list, cfg: object,
                  seed: int, tenancy: object) -> None:
    """``summary[p]["fairness"]`` for every policy (the reference runs: fair share off, each
    owner alone on its share; see :mod:`miso.sim.fairness`)."""
    from miso.sched.tenancyconfig import TenancyConfig
    from miso.sim.fairness import fairness_of
    from miso.sim.run import run_policy

    ten = tenancy if isinstance(tenancy, TenancyConfig) else TenancyConfig(fair_share=False)
    for p in pols:
        summary[p]["fairness"] = fairness_of(p, raw[p], tjobs, cfg, seed, ten, run_policy)


def print_fairness(summary: dict) -> None:
    from rich.table import Table

    t = Table("policy", "owner", "sharing incentive", "entitled GPUs", "avg JCT s",
              "alone avg JCT s")
    for p, s in summary.items():
        f = s["fairness"]
        for o, si in f["sharing_incentive"].items():
            t.add_row(p, o, f"{si:.2f}", str(f["entitled_gpus"][o]),
                      f"{f['owners_avg_jct_s'][o]:.0f}", f"{f['owners_alone_avg_jct_s'][o]:.0f}")
    c = make_console()
    c.print(t)
    for p, s in summary.items():
        f = s["fairness"]
        c.print(f"{p}: price of fairness {f['price']:+.1%} (avg JCT {f['avg_jct_s']:.0f} s vs "
                f"{f['off_avg_jct_s']:.0f} s with fair share off); finish-time fairness rho "
                f"max {f['rho_max']:.2f}, p95 {f['rho_p95']:.2f}; reclaims {f['reclaims']} "
                f"({f.get('reclaims_useless', 0)} that left their job no faster), "
                f"restarts {f['restarts']} (off: {f['off_restarts']})")


def print_owners(summary: dict[str, dict[str, Any]]) -> None:
    """Per-owner results of a run with owners (``--tenants``, a trace's users): jobs, average
    JCT, mean slowdown and share of the GPU time, per policy; Jain's index over the owners'
    slowdowns."""
    from rich.table import Table

    rows = [(p, o, v) for p, s in summary.items()
            for o, v in (s.get("owners") or {}).items()]
    if not rows:
        return
    t = Table("policy", "owner", "jobs", "avg JCT s", "mean slowdown", "GPU share",
              title="Per owner")
    for p, o, v in rows:
        t.add_row(p, str(o), str(v["jobs"]), f"{v['avg_jct_s']:.0f}",
                  f"{v['mean_slowdown']:.2f}", f"{100 * v['gpu_share']:.0f}%")
    con = make_console()
    con.print(t)
    for p, s in summary.items():
        if "jain_slowdown" in s:
            con.print(f"{p}: Jain's fairness index over the owners' mean slowdowns "
                      f"{s['jain_slowdown']:.3f} (1 = equal)")
