"""Tenancy (issue 16): fair share between owners, and high priority with preemption, in the
simulator (miso+ unless --policy says otherwise).

    python benchmarks/sim/tenancy.py [--seeds 1] [--jobs 1000] [--gpus 16] [--json FILE]

1. Two owners on ``--gpus`` A100-40GB, one submitting 80 % of ``--jobs`` Poisson jobs (60 s),
   equal weights: fair share off vs on (Jain's index over per-owner mean slowdown, each owner's
   average JCT, total average JCT), and the light owner's jobs alone on half the cluster.
2. The Philly trace (first ``--philly-jobs`` jobs) with owners from its ``vc`` column on 40
   GPUs: Jain's index and total average JCT, fair share off vs on.
   Then the heavy owner capped by a static in-use quota (half, 5/8, 3/4 of the GPUs).
3. ``--priority-frac`` (10 %) high-priority jobs in the saturated cluster of 1.: their average
   queueing delay (submit to first start) against normal jobs', without and with preemption;
   restarts per job and the GPU time preemption threw away.

Prints Markdown tables; the figures in benchmarks/README.md ("Tenancy") come from this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from miso.sched.tenancy import TenancyConfig
from miso.sim.metrics import summarize
from miso.sim.run import run_policy
from miso.sim.traces import assign_tenants, load_trace, mark_priority, poisson_jobs
from miso.sim.world import WorldConfig


def run(policy, jobs, cfg, seed, tenancy):  # noqa: ANN001, ANN201
    return summarize(run_policy(policy, jobs, cfg, seed, tenancy=tenancy))


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
                    help="comma list of parts to skip: skew,quota,philly,priority")
    ap.add_argument("--json", default="benchmarks/sim/results/tenancy.json")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    pol = a.policy
    out: dict[str, object] = {"policy": pol, "jobs": a.jobs, "gpus": a.gpus,
                              "duration_column": a.duration_column}
    t0 = time.perf_counter()
    off, on = TenancyConfig(fair_share=False), TenancyConfig(fair_share=True)

    if "skew" not in skip:
        print(f"## Two owners, 80 / 20 % of {a.jobs} Poisson jobs (60 s, durations "
              f"{a.duration_column}), {a.gpus} A100-40GB, equal weights, {pol}")
        print("| seed | fair share | total avg JCT s | heavy avg JCT s | light avg JCT s "
              "| heavy / light mean slowdown | Jain (slowdown) | light alone on half: avg JCT s "
              "| light / alone |")
        print("|---|---|---|---|---|---|---|---|---|")
        rows = []
        for seed in range(1, a.seeds + 1):
            jobs = assign_tenants(poisson_jobs(a.jobs, seed=seed,
                                               duration_column=a.duration_column),
                                  2, 0.8, seed=seed)
            light = [j for j in jobs if j.owner == "u1"]
            alone = summarize(run_policy(pol, light, WorldConfig(n_gpus=a.gpus // 2), seed))
            for name, ten in (("off", off), ("on", on)):
                s = run(pol, jobs, WorldConfig(n_gpus=a.gpus), seed, ten)
                o = s["owners"]
                row = {"seed": seed, "fair_share": name, "avg_jct_s": s["avg_jct_s"],
                       "heavy_jct_s": o["u0"]["avg_jct_s"], "light_jct_s": o["u1"]["avg_jct_s"],
                       "heavy_slowdown": o["u0"]["mean_slowdown"],
                       "light_slowdown": o["u1"]["mean_slowdown"],
                       "jain": s["jain_slowdown"], "light_alone_jct_s": alone["avg_jct_s"],
                       "gpu_share": {k: v["gpu_share"] for k, v in o.items()}}
                rows.append(row)
                print(f"| {seed} | {name} | {row['avg_jct_s']:.0f} | {row['heavy_jct_s']:.0f} | "
                      f"{row['light_jct_s']:.0f} | {row['heavy_slowdown']:.2f} / "
                      f"{row['light_slowdown']:.2f} | {row['jain']:.3f} | "
                      f"{row['light_alone_jct_s']:.0f} | "
                      f"{row['light_jct_s'] / row['light_alone_jct_s']:.2f} |", flush=True)
        on_rows = [r for r in rows if r["fair_share"] == "on"]
        off_rows = [r for r in rows if r["fair_share"] == "off"]
        tot = statistics.mean(r["avg_jct_s"] for r in on_rows) / \
            statistics.mean(r["avg_jct_s"] for r in off_rows)
        jain = statistics.mean(r["jain"] for r in on_rows)
        ratio = statistics.mean(r["light_jct_s"] / r["light_alone_jct_s"] for r in on_rows)
        print(f"\nTargets (fair share on, mean over seeds): Jain {jain:.3f} (>= 0.95: "
              f"{'met' if jain >= 0.95 else 'MISSED'}); light / alone on half {ratio:.2f} "
              f"(<= 1.25: {'met' if ratio <= 1.25 else 'MISSED'}); total avg JCT on / off "
              f"{tot:.3f} (within 5 %: {'met' if abs(tot - 1) <= 0.05 else 'MISSED'})",
              flush=True)
        out["skew"] = {"rows": rows, "jain_on": jain, "light_over_alone": ratio,
                       "total_on_over_off": tot}

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
        print(f"\n## Philly, first {a.philly_jobs} jobs, owners = vc, {a.philly_gpus} GPUs, {pol}")
        print("| fair share | owners | total avg JCT s | Jain (slowdown) | min / max owner mean "
              "slowdown |")
        print("|---|---|---|---|---|")
        jobs = load_trace("philly", seed=1, max_jobs=a.philly_jobs)
        philly = {}
        for name, ten in (("off", off), ("on", on)):
            s = run(pol, jobs, WorldConfig(n_gpus=a.philly_gpus), 1, ten)
            sl = [v["mean_slowdown"] for v in s["owners"].values()]
            philly[name] = {"avg_jct_s": s["avg_jct_s"], "jain": s["jain_slowdown"],
                            "owners": s["owners"]}
            print(f"| {name} | {len(sl)} | {s['avg_jct_s']:.0f} | {s['jain_slowdown']:.3f} | "
                  f"{min(sl):.2f} / {max(sl):.2f} |", flush=True)
        out["philly"] = philly

    if "priority" not in skip:
        print(f"\n## {a.priority_frac:.0%} high-priority jobs, {a.jobs} Poisson jobs (60 s), "
              f"{a.gpus} GPUs, {pol}, fair share on")
        print("| preemption | high: avg queueing delay s | normal: avg queueing delay s "
              "| high / normal | high avg JCT s | normal avg JCT s | restarts/job (high, normal) "
              "| preemptions | GPU h lost to preemption | total avg JCT s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
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
                      f"{s['preempt_lost_gpu_s'] / 3600:.2f} | {s['avg_jct_s']:.0f} |",
                      flush=True)
        out["priority"] = prio
    print(f"\n(wall {time.perf_counter() - t0:.0f} s)")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
