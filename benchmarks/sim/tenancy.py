"""Tenancy (issue 16): fair share between owners, and high priority with preemption, in the
simulator (miso+ unless --policy says otherwise).

    python benchmarks/sim/tenancy.py [--seeds 1] [--jobs 1000] [--gpus 16] [--json FILE]
        [--experiment keep-apart]

1. Two owners on ``--gpus`` A100-40GB, one submitting 80 % of ``--jobs`` Poisson jobs (60 s),
   equal weights: fair share off, on with ordering only (``reclaim=False``), and on (fair
   slices and reclaim, the default): the price (total average JCT / off - 1), each owner's
   sharing incentive (its average JCT / alone on its entitled half), the jobs' finish-time
   fairness (rho max and p95), restarts and reclaims; Jain's index over per-owner mean
   slowdown only as a secondary figure (it ranks FIFO fairest; issue 31). Then (``sizes``)
   the trade-off of the fair slice's cap ``demand_per_job`` (1/3: 2g, 1/2: 3g, 1: up to a
   whole GPU).
2. The Philly trace (first ``--philly-jobs`` jobs) with owners from its ``vc`` column on 40
   GPUs: the same figures (each vc alone on its entitled 4 GPUs, or on as many as its largest
   gang asks for), at simulator seeds 1..``--seeds``: fair share off, order only, on, on
   with ``demand_per_job`` 1/3 and on with ``--fairness-price`` (issue 31's target: max
   sharing incentive <= 1.5 at a price <= 3 %), each with the largest vc's short jobs' mean
   slowdown (its jobs shorter than the trace's median).
   Then the heavy owner capped by a static in-use quota (half, 5/8, 3/4 of the GPUs).
3. ``--priority-frac`` (10 %) high-priority jobs in the saturated cluster of 1.: their average
   queueing delay (submit to first start) against normal jobs', without and with preemption;
   restarts per job and the GPU time preemption (and fair share's reclaim) threw away.

4. (``price``, issue 31) the fairness price: the two owners at 0.9x, 1.6x and 3.25x the
   cluster (inter-arrival 217, 122, 60 s) with fair slices that follow the backlog within
   ``--fairness-price`` (5 %): price, sharing incentives, rho, reclaims and those that left
   their job no faster; and Philly by vc with the price (max sharing incentive, and the
   largest vc's short jobs' mean slowdown: its jobs shorter than the trace's median).

Prints Markdown tables; the figures in benchmarks/README.md ("Tenancy") come from this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.fairness import fairness_report, reference_runs
from miso.sim.metrics import summarize
from miso.sim.run import run_policy
from miso.sim.traces import assign_tenants, load_trace, mark_priority, poisson_jobs
from miso.sim.world import WorldConfig


def run(policy, jobs, cfg, seed, tenancy):  # noqa: ANN001, ANN201
    return summarize(run_policy(policy, jobs, cfg, seed, tenancy=tenancy))


def price_part(a: argparse.Namespace, pol: str) -> dict[str, object]:
    """Issue 31's targets: fair slices within a stated price at three loads, and Philly."""
    price = TenancyConfig(fairness_price=a.fairness_price)
    got: dict[str, object] = {}
    print(f"\n## Fair slices within a stated price ({a.fairness_price:.0%}), two owners 80/20, "
          f"{a.jobs} Poisson jobs, {a.gpus} A100-40GB, {pol}")
    print("| inter-arrival s | seed | price | sharing incentive heavy / light | rho max | "
          "rho p95 | reclaims | reclaims that left their job no faster |")
    print("|---|---|---|---|---|---|---|---|")
    cfg = WorldConfig(n_gpus=a.gpus)
    for iat in (float(x) for x in a.loads.split(",")):
        for seed in range(1, a.seeds + 1):
            jobs = assign_tenants(poisson_jobs(a.jobs, seed=seed, mean_interarrival_s=iat,
                                               duration_column=a.duration_column),
                                  2, 0.8, seed=seed)
            ref_off, alone, ents = reference_runs(pol, jobs, cfg, seed, price, run_policy)
            f = fairness_report(run_policy(pol, jobs, cfg, seed, tenancy=price), ref_off,
                                alone, ents)
            si = f["sharing_incentive"]
            got[f"{iat:g}/{seed}"] = f
            print(f"| {iat:g} | {seed} | {f['price']:+.1%} | {si['u0']:.3f} / {si['u1']:.3f} | "
                  f"{f['rho_max']:.2f} | {f['rho_p95']:.2f} | {f['reclaims']} | "
                  f"{f['reclaims_useless']} |", flush=True)
    jobs = load_trace("philly", seed=1, max_jobs=a.philly_jobs)
    pcfg = WorldConfig(n_gpus=a.philly_gpus)
    ref_off, alone, ents = reference_runs(pol, jobs, pcfg, 1, price, run_policy)
    r = run_policy(pol, jobs, pcfg, 1, tenancy=price)
    f = fairness_report(r, ref_off, alone, ents)
    owners = np.array(r.owners)
    big = max(set(r.owners), key=lambda o: int((owners == o).sum()))
    short = (owners == big) & (r.duration < np.median(r.duration))
    slow = float((r.jct[short] / r.duration[short]).mean())
    off_jct = dict(zip(ref_off.job_ids, ref_off.jct, strict=True))
    ids = [i for i, k in zip(r.job_ids, short, strict=True) if k]
    slow_off = float(np.mean([off_jct[i] for i in ids] / r.duration[short]))
    print(f"\nPhilly by vc (first {a.philly_jobs} jobs, {a.philly_gpus} GPUs), price "
          f"{a.fairness_price:.0%}: price {f['price']:+.1%}, max sharing incentive "
          f"{f['sharing_incentive_max']:.2f}, rho max {f['rho_max']:.2f}; largest vc {big} "
          f"({int((owners == big).sum())} jobs): its short jobs' mean slowdown {slow:.2f} "
          f"(fair share off: {slow_off:.2f}); reclaims {f['reclaims']}, no faster "
          f"{f['reclaims_useless']}", flush=True)
    got["philly"] = {**f, "largest_vc": big, "largest_vc_short_slowdown": slow,
                     "largest_vc_short_slowdown_off": slow_off}
    philly_by_vc(jobs, r, ref_off, f)
    return got


def philly_by_vc(jobs, r, off, f, alone=None) -> None:  # noqa: ANN001
    """Per vc: its jobs and gangs, the GPUs of its alone run (its entitled share, rounded up
    to its largest gang), average JCTs shared / off / alone, sharing incentive on and off;
    with ``alone`` (owner -> its alone run) also where its JCT went, shared vs alone
    (:func:`jct_parts`)."""
    asks: dict[str, list[int]] = {}
    for j in jobs:
        asks.setdefault(j.owner, []).append(j.num_gpus)
    offo = np.array(off.owners)
    extra = (" | wait s one-GPU (alone) | wait s gangs (alone) | running s (alone) | "
             "restarts/job") if alone else ""
    print("| vc | jobs | gangs | alone on GPUs | avg JCT s shared | off | alone | "
          f"sharing incentive | off{extra} |")
    print("|---|---|---|---|---|---|---|---|---" + ("|---|---|---|---" if alone else "") + "|")
    for o in sorted(asks, key=lambda o: -len(asks[o])):
        al = f["owners_alone_avg_jct_s"][o]
        off_o = float(off.jct[offo == o].mean())
        row = (f"| {o} | {len(asks[o])} | {sum(n > 1 for n in asks[o])} | "
               f"{f['entitled_gpus'][o]} | {f['owners_avg_jct_s'][o]:,.0f} | {off_o:,.0f} | "
               f"{al:,.0f} | {f['sharing_incentive'][o]:.2f} | {off_o / al:.2f} |")
        if alone:
            w1, wg, run, rs = jct_parts(r, o)
            a1, ag, arun, _ = jct_parts(alone[o], o)
            row += (f" {w1:,.0f} ({a1:,.0f}) | {wg:,.0f} ({ag:,.0f}) | {run:,.0f} ({arun:,.0f})"
                    f" | {rs:.2f} |")
        print(row, flush=True)


def jct_parts(r, owner: str) -> tuple[float, float, float, float]:  # noqa: ANN001
    """Where ``owner``'s average JCT in run ``r`` went: its one-GPU jobs' and its gangs'
    average wait for a first start (each averaged over all the owner's jobs, so the parts
    add up), the average time from first start to the end (slices smaller than alone,
    restarts and waits after a requeue) and restarts per job."""
    m = np.array(r.owners) == owner
    ng = np.asarray(r.num_gpus) if r.num_gpus is not None else np.ones(len(m))
    wait = np.asarray(r.first_start) - r.submit
    n = max(1, int(m.sum()))
    return (float(wait[m & (ng == 1)].sum()) / n, float(wait[m & (ng > 1)].sum()) / n,
            float((r.finish - np.asarray(r.first_start))[m].mean()),
            float(r.restarts[m].sum()) / n)


def short_slowdown(r) -> tuple[str, float]:  # noqa: ANN001
    """The largest vc and its short jobs' (shorter than the trace's median) mean slowdown."""
    owners = np.array(r.owners)
    big = max(set(r.owners), key=lambda o: int((owners == o).sum()))
    short = (owners == big) & (r.duration < np.median(r.duration))
    return big, float((r.jct[short] / r.duration[short]).mean())


def philly_part(a: argparse.Namespace, pol: str, modes) -> dict[str, object]:  # noqa: ANN001
    """Philly by vc at seeds 1..``--seeds`` (the simulator's seed; the trace is the same):
    fair share off, order only, on, on with ``demand_per_job`` 1/3 and on with the stated
    ``--fairness-price`` (issue 31's target: max sharing incentive <= 1.5 at a price <= 3 %),
    with the largest vc's short jobs' mean slowdown."""
    print(f"\n## Philly, first {a.philly_jobs} jobs, owners = vc, {a.philly_gpus} GPUs, {pol}")
    print("| seed | fair share | owners | total avg JCT s | price | max sharing incentive "
          "| rho max | rho p95 | Jain (slowdown, secondary) | reclaims | largest vc's short "
          "jobs' mean slowdown |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    jobs = load_trace("philly", seed=1, max_jobs=a.philly_jobs)
    pcfg = WorldConfig(n_gpus=a.philly_gpus)
    on = dict(modes)["on"]
    philly: dict[str, object] = {}
    per_vc = []
    for seed in range(1, a.seeds + 1):
        ref_off, alone, ents = reference_runs(pol, jobs, pcfg, seed, on, run_policy)
        for name, ten in (*modes, ("on, demand_per_job 1/3", TenancyConfig(demand_per_job=1 / 3)),
                          (f"on, price {a.fairness_price:.0%}",
                           TenancyConfig(fairness_price=a.fairness_price))):
            r = run_policy(pol, jobs, pcfg, seed, tenancy=ten)
            s = summarize(r)
            f = fairness_report(r, ref_off, alone, ents)
            big, slow = short_slowdown(r)
            key = name if seed == 1 else f"{name} (seed {seed})"
            philly[key] = {"avg_jct_s": s["avg_jct_s"], "jain": s["jain_slowdown"],
                           "owners": s["owners"], "reclaims": s["reclaims"], "fairness": f,
                           "largest_vc": big, "largest_vc_short_slowdown": slow}
            print(f"| {seed} | {name} | {len(s['owners'])} | {s['avg_jct_s']:.0f} | "
                  f"{f['price']:+.1%} | {f['sharing_incentive_max']:.2f} | {f['rho_max']:.2f} | "
                  f"{f['rho_p95']:.2f} | {s['jain_slowdown']:.3f} | {s['reclaims']} | "
                  f"{slow:.2f} ({big}) |", flush=True)
        per_vc.append((seed, r, ref_off, f, alone))
    for seed, r, ref_off, f, alone in per_vc:   # where each vc's JCT went, at the price
        print(f"\nPer vc, seed {seed}, on with price {a.fairness_price:.0%}:")
        philly_by_vc(jobs, r, ref_off, f, alone)
    return philly


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=16)
    ap.add_argument("--policy", default="miso+")
    ap.add_argument("--philly-jobs", type=int, default=1000)
    ap.add_argument("--philly-gpus", type=int, default=40)
    ap.add_argument("--priority-frac", type=float, default=0.1)
    ap.add_argument("--duration-column", default="exp_100_value",
                    help="MISO-trace column of the Poisson jobs' durations (exp_100_value: "
                    "mean 3,122 s, the default of `miso simulate`; duration_s: mean 770 s)")
    ap.add_argument("--skip", default="",
                    help="comma list of parts to skip: skew,sizes,quota,philly,priority,price")
    ap.add_argument("--fairness-price", type=float, default=0.05)
    ap.add_argument("--loads", default="217,122,60",
                    help="inter-arrival times (s) of the price part")
    ap.add_argument("--json", default="benchmarks/sim/results/tenancy.json")
    ap.add_argument("--experiment", choices=["keep-apart"], default=None,
                    help="run --policy with an experiment's plugins (not shipped): keep-apart "
                    "keeps owners above their entitlement off a protected owner's GPUs "
                    "(miso.sched.experiments.fairapart; benchmarks/history/"
                    "2026-12-03-h13-sat.md)")
    a = ap.parse_args()
    if a.experiment == "keep-apart":
        from miso.sched.experiments.fairapart import keep_apart_profile
        from miso.sched.policies import POLICIES
        POLICIES[a.policy] = keep_apart_profile(a.policy)
    skip = set(filter(None, a.skip.split(",")))
    pol = a.policy
    out: dict[str, object] = {"policy": pol, "jobs": a.jobs, "gpus": a.gpus,
                              "duration_column": a.duration_column}
    t0 = time.perf_counter()
    off, on = TenancyConfig(fair_share=False), TenancyConfig(fair_share=True)
    order = TenancyConfig(fair_share=True, reclaim=False)
    modes = (("off", off), ("order", order), ("on", on))

    def two_owners(seed: int, heavy: bool = False) -> tuple[list, float, float | None]:
        """The jobs; the light (and, with ``heavy``, the heavy) owner's average JCT alone on
        half the cluster."""
        jobs = assign_tenants(poisson_jobs(a.jobs, seed=seed, duration_column=a.duration_column),
                              2, 0.8, seed=seed)
        half = WorldConfig(n_gpus=a.gpus // 2)
        alone = summarize(run_policy(pol, [j for j in jobs if j.owner == "u1"], half, seed))
        h = summarize(run_policy(pol, [j for j in jobs if j.owner == "u0"], half, seed)) \
            if heavy else None
        return jobs, alone["avg_jct_s"], None if h is None else h["avg_jct_s"]

    def targets(rows: list[dict], mode: str) -> dict[str, float]:
        mine = [r for r in rows if r["fair_share"] == mode]
        return {k: statistics.mean(r[k] for r in mine)
                for k in ("price", "light_incentive", "heavy_incentive", "rho_max", "rho_p95",
                          "jain_slowdown")}

    def verdict(t: dict[str, float]) -> str:
        return (f"price {t['price']:+.1%}, sharing incentive light {t['light_incentive']:.2f} / "
                f"heavy {t['heavy_incentive']:.2f}, finish-time fairness rho max "
                f"{t['rho_max']:.2f} p95 {t['rho_p95']:.2f} (Jain over slowdown, secondary: "
                f"{t['jain_slowdown']:.3f})")

    if "skew" not in skip:
        print(f"## Two owners, 80 / 20 % of {a.jobs} Poisson jobs (60 s, durations "
              f"{a.duration_column}), {a.gpus} A100-40GB, equal weights, {pol}")
        print("Sharing incentive: an owner's average JCT / its average JCT alone on its "
              "entitled half; rho: a job's JCT / its JCT in its owner's alone run (Themis); "
              "price: total average JCT / fair share off - 1 (src/miso/sim/fairness.py).\n")
        print("| seed | fair share | total avg JCT s | price | sharing incentive heavy / light "
              "| rho max | rho p95 | Jain (slowdown, secondary) | restarts/job | reclaims "
              "| GPU h lost to reclaim |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        rows = []
        cfg = WorldConfig(n_gpus=a.gpus)
        for seed in range(1, a.seeds + 1):
            jobs = assign_tenants(poisson_jobs(a.jobs, seed=seed,
                                               duration_column=a.duration_column),
                                  2, 0.8, seed=seed)
            ref_off, alone, ents = reference_runs(pol, jobs, cfg, seed, on, run_policy)
            for name, ten in modes:
                r = run_policy(pol, jobs, cfg, seed, tenancy=ten)
                s = summarize(r)
                f = fairness_report(r, ref_off, alone, ents)
                si = f["sharing_incentive"]
                row = {"seed": seed, "fair_share": name, "avg_jct_s": s["avg_jct_s"],
                       "price": f["price"], "heavy_incentive": si["u0"],
                       "light_incentive": si["u1"], "rho_max": f["rho_max"],
                       "rho_p95": f["rho_p95"], "jain_slowdown": s["jain_slowdown"],
                       "restarts_per_job": s["restarts_per_job"], "reclaims": s["reclaims"],
                       "reclaim_lost_gpu_s": s["reclaim_lost_gpu_s"], "fairness": f}
                rows.append(row)
                print(f"| {seed} | {name} | {row['avg_jct_s']:.0f} | {f['price']:+.1%} | "
                      f"{si['u0']:.2f} / {si['u1']:.2f} | {f['rho_max']:.2f} | "
                      f"{f['rho_p95']:.2f} | {row['jain_slowdown']:.3f} | "
                      f"{row['restarts_per_job']:.2f} | {row['reclaims']} | "
                      f"{row['reclaim_lost_gpu_s'] / 3600:.2f} |", flush=True)
        got = {m: targets(rows, m) for m in ("order", "on")}
        print(f"\nMean over seeds: order only: {verdict(got['order'])}\n"
              f"fair slices + reclaim (on): {verdict(got['on'])}", flush=True)
        out["skew"] = {"rows": rows, "means": got}

    if "sizes" not in skip:
        print(f"\n## The fair slice's cap (demand_per_job), same jobs, {pol}, mean of "
              f"{a.seeds} seed(s)")
        print("| demand_per_job (fair slice at most) | light / alone on half | total avg JCT / "
              "off | Jain (slowdown) | restarts/job | reclaims/job |")
        print("|---|---|---|---|---|---|")
        sizes = {}
        runs = {}
        for seed in range(1, a.seeds + 1):
            jobs, alone, _ = two_owners(seed)
            base = run(pol, jobs, WorldConfig(n_gpus=a.gpus), seed, off)["avg_jct_s"]
            for d in (1 / 3, 0.5, 1.0):
                s = run(pol, jobs, WorldConfig(n_gpus=a.gpus), seed,
                        TenancyConfig(demand_per_job=d))
                runs.setdefault(d, []).append(
                    (s["owners"]["u1"]["avg_jct_s"] / alone, s["avg_jct_s"] / base,
                     s["jain_slowdown"], s["restarts_per_job"], s["reclaims"] / s["jobs"]))
        for d, rs in runs.items():
            m = [statistics.mean(x[i] for x in rs) for i in range(5)]
            label = {1 / 3: "1/3 (2g)", 0.5: "1/2 (3g)", 1.0: "1 (7g)"}[d]
            sizes[f"{d:.3f}"] = dict(zip(("light_over_alone", "total_over_off", "jain",
                                          "restarts_per_job", "reclaims_per_job"), m,
                                         strict=True))
            print(f"| {label} | {m[0]:.2f} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.2f} | "
                  f"{m[4]:.2f} |", flush=True)
        out["sizes"] = sizes

    if "quota" not in skip:
        print("\n## The heavy owner capped by an in-use quota (GPU-equivalents), seed 1, "
              "same jobs as above, fair share off")
        print("| heavy quota | total avg JCT s | heavy avg JCT s | light avg JCT s | Jain "
              "(slowdown) |")
        print("|---|---|---|---|---|")
        jobs = assign_tenants(poisson_jobs(a.jobs, seed=1, duration_column=a.duration_column),
                              2, 0.8, seed=1)
        quota = {}
        for cap in (a.gpus / 2, a.gpus * 5 / 8, a.gpus * 3 / 4):
            s = run(pol, jobs, WorldConfig(n_gpus=a.gpus), 1,
                    TenancyConfig(fair_share=False, max_in_use={"u0": cap}))
            o = s["owners"]
            quota[f"{cap:g}"] = s
            print(f"| {cap:g} | {s['avg_jct_s']:.0f} | {o['u0']['avg_jct_s']:.0f} | "
                  f"{o['u1']['avg_jct_s']:.0f} | {s['jain_slowdown']:.3f} |", flush=True)
        out["quota"] = quota

    if "philly" not in skip:
        out["philly"] = philly_part(a, pol, modes)

    if "price" not in skip:
        out["price"] = price_part(a, pol)

    if "priority" not in skip:
        print(f"\n## {a.priority_frac:.0%} high-priority jobs, {a.jobs} Poisson jobs (60 s), "
              f"{a.gpus} GPUs, {pol}, fair share on")
        print("| preemption | high: avg queueing delay s | normal: avg queueing delay s "
              "| high / normal | high avg JCT s | normal avg JCT s | restarts/job (high, normal) "
              "| preemptions | GPU h lost to preemption | reclaims | GPU h lost to reclaim "
              "| total avg JCT s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        prio = {}
        for seed in range(1, a.seeds + 1):
            jobs = mark_priority(assign_tenants(
                poisson_jobs(a.jobs, seed=seed, duration_column=a.duration_column), 2, 0.8,
                seed=seed), a.priority_frac, seed=seed)
            for name, ten in (("off", on),
                              ("on", TenancyConfig(fair_share=True, preempt=True))):
                s = run(pol, jobs, WorldConfig(n_gpus=a.gpus), seed, ten)
                p = s["priorities"]
                hi, no = p["high"], p["normal"]
                ratio = hi["avg_queue_delay_s"] / no["avg_queue_delay_s"]
                prio[f"{seed}/{name}"] = s
                print(f"| {name} (seed {seed}) | {hi['avg_queue_delay_s']:.0f} | "
                      f"{no['avg_queue_delay_s']:.0f} | {ratio:.4f} | {hi['avg_jct_s']:.0f} | "
                      f"{no['avg_jct_s']:.0f} | {hi['restarts_per_job']:.2f}, "
                      f"{no['restarts_per_job']:.2f} | {s['preemptions']} | "
                      f"{s['preempt_lost_gpu_s'] / 3600:.2f} | {s['reclaims']} | "
                      f"{s['reclaim_lost_gpu_s'] / 3600:.2f} | {s['avg_jct_s']:.0f} |",
                      flush=True)
        out["priority"] = prio
    print(f"\n(wall {time.perf_counter() - t0:.0f} s)")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
