"""Where miso+'s 6 % against true speeds goes in the paper setting, and whether measuring
newcomers on the cluster itself can buy it back (issue 19, item 5; benchmarks/README.md
"Predictor, fourth pass").

usage: PYTHONPATH=src python benchmarks/predictor/sim_gap.py [--seeds 5] [--families]
                                                              [--loss-only] [--only TEXT]

Same runs as ``sim_heldout.py`` / ``sim_measure_first.py`` (1,000 Poisson jobs, 60 s mean
inter-arrival, miso+ with the held-out-family predictor, every family new; ratio of the mean
average JCT over the seeds to miso+ with true speeds on the same trace, worst seed too), paper
setting (40 GPUs, restart 30 s) and saturated (16 GPUs, restart 60 s):

* **loss by workload** (seed 1, 40 GPUs): each workload's share of the difference in average
  JCT, and where its jobs ran (time share per slice) with true speeds and held out;
* ``learn_earlier_slices`` (miso+ switch, off by default): once a job planned with the prior
  shows its full-GPU rate, the rates it showed on its earlier slices become their speeds;
  ``memory_prior`` (miso+ switch, off by default): a job planned with the prior gets the slice
  speeds of the catalogue workloads of similar memory, its own family left out
  (:mod:`miso.sched.memoryprior`);
* **decisions with the prior skewed** (the information stays the same): the catalogue prior's
  slice speeds times ``k`` everywhere, or only in the rebalance decision (an unmeasured job
  on a slice is the preferred donor to an idle GPU);
* **measure in place**: a job runs alone on a full GPU for ``MEAS`` seconds as a layout is
  applied, so miso+ learns its full-GPU rate and, through its observed-rate path, the speed of
  every slice it ran or runs on. Costs charged by the simulator: the GPU's jobs that the layout
  (re)starts wait ``MEAS`` + one MIG reconfiguration longer per measured job (and one more
  reconfiguration); a measured newcomer keeps the ``MEAS`` seconds of work and restarts onto
  its slice (one restart). Which jobs: ``restart``, newcomers whose layout restarts residents
  anyway; ``natural``, every unmeasured job a layout (re)starts where it restarts someone
  anyway; ``all``, every newcomer placed on a shared GPU, the residents the layout would have
  left running stopped for the stint (one restart each); ``cheapest``, the same on the GPU
  with the fewest jobs (its jobs stopped instead). Each also "free" (the rate revealed,
  nothing charged): the mechanism's upper bound; and ``all`` gated by an oracle on the value
  of information (only jobs whose true curve is at least ``gap`` off the prior are measured).

The in-place rows are simulator instrumentation, not a miso+ switch: none comes within 3 %
once charged (benchmarks/README.md "Predictor, fourth pass"), so no live decision was built.
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from sim_heldout import avg_jct, family_trace  # noqa: E402

from miso.sched.decisions import ApplyLayout  # noqa: E402
from miso.sched.experiments import LearnEarlierSlices, MemoryPrior  # noqa: E402
from miso.sched.policies.estimates import SpeedPlugin  # noqa: E402
from miso.sched.policies.rebalance import Rebalancing  # noqa: E402
from miso.sched.speeds import prior_speeds  # noqa: E402
from miso.sim.engine import Simulator  # noqa: E402
from miso.sim.heldout import families  # noqa: E402
from miso.sim.metrics import summarize  # noqa: E402
from miso.sim.run import build_policy  # noqa: E402
from miso.sim.traces import poisson_jobs  # noqa: E402
from miso.sim.world import WorldConfig  # noqa: E402

SETTINGS = ((40, 30.0), (16, 60.0))


def simulator(gpus: int, restart: float, seed: int, predictor: str = "heldout",
              family: str | None = None, **policy: object) -> Simulator:
    cfg = WorldConfig(n_gpus=gpus, predictor=predictor, restart_s=restart)
    jobs = poisson_jobs(1000, seed=seed, mean_interarrival_s=60.0)
    if family is not None:
        jobs = family_trace(jobs, family, seed)
    return Simulator(build_policy("miso+", jobs, cfg, seed, **policy), jobs, cfg, seed=seed)


def slice_time(sim: Simulator) -> dict[tuple[str, str], float]:
    """Records (job, profile) -> seconds run there (MIG profile, or the mode) as ``sim`` runs."""
    occ: dict[tuple[str, str], float] = collections.defaultdict(float)
    orig = sim.set_rate

    def set_rate(j, now, rate):  # noqa: ANN001, ANN202
        if j.rate > 0:
            key = j.placement.profile if j.mode == "mig" and j.placement else str(j.mode)
            occ[(j.id, key)] += now - j.t_last
        orig(j, now, rate)
    sim.set_rate = set_rate  # type: ignore[method-assign]
    return occ


def loss_by_workload(seed: int = 1) -> None:
    runs = {}
    for pred in ("true", "heldout"):
        sim = simulator(40, 30.0, seed, pred)
        occ = slice_time(sim)
        sim.run()
        runs[pred] = (sim, occ)
    (t, ot), (h, oh) = runs["true"], runs["heldout"]
    n = len(t.jobs)
    jct = {p: {j: s.jobs[j].finish - s.jobs[j].submit for j in s.jobs}
           for p, (s, _) in runs.items()}
    print(f"\nseed {seed}, 40 GPUs, restart 30 s: average JCT true "
          f"{np.mean(list(jct['true'].values())):.0f} s, held out "
          f"{np.mean(list(jct['heldout'].values())):.0f} s\n")
    print("| workload | jobs | JCT true s | JCT held out s | share of the gap (s of avg JCT) | "
          "true speeds 3g / 4g | time on 3g / 4g / 7g, true | same, held out |")
    print("|---|---|---|---|---|---|---|---|")
    by: dict[str, list[str]] = collections.defaultdict(list)
    for j, sj in t.jobs.items():
        by[sj.workload].append(j)

    def share(occ: dict, jobs: list[str]) -> str:
        c: collections.Counter[str] = collections.Counter()
        for (j, p), s in occ.items():
            if j in jobs:
                c[p] += s
        tot = sum(c.values()) or 1.0
        return " / ".join(f"{c[p] / tot:.2f}" for p in ("3g.20gb", "4g.20gb", "7g.40gb"))

    for wl, js in sorted(by.items(), key=lambda kv: -sum(jct["heldout"][j] - jct["true"][j]
                                                          for j in kv[1])):
        gap = sum(jct["heldout"][j] - jct["true"][j] for j in js) / n
        tr = t.jobs[js[0]].truth
        print(f"| {wl} | {len(js)} | {np.mean([jct['true'][j] for j in js]):.0f} | "
              f"{np.mean([jct['heldout'][j] for j in js]):.0f} | {gap:.1f} | "
              f"{tr.get('3g.20gb', float('nan')):.2f} / {tr.get('4g.20gb', float('nan')):.2f} | "
              f"{share(ot, js)} | {share(oh, js)} |")
    del h, oh


@dataclass(frozen=True)
class ScaledPrior(SpeedPlugin):
    """An estimate plugin: the catalogue prior with every slice below the full GPU times
    ``k``."""

    k: float

    def prior(self, pol, sc, geom, job, speeds, batch):  # noqa: ANN001, ANN201
        full = geom.model.full_profile().name
        return {q: v if q == full else v * self.k for q, v in speeds.items()}


def pessimistic_donor(k: float):  # noqa: ANN201
    """``Rebalancing.best_donor`` with an unmeasured job's slice speed times ``k``."""
    def best_donor(self, sc, g, measured):  # noqa: ANN001, ANN202
        pol = self.pol
        gs = sc.state.gpus[g]
        jobs = sc.jobs_on(g)
        if len(jobs) < 2 or gs.busy:
            return None
        pinned = pol.pinned(sc, jobs)
        full = gs.geom.model.full_profile().name
        costs = pol.restarts.seen
        best = None
        for j in jobs:
            pl = gs.assignment.get(j)
            c = costs.get(j)
            if pl is None or j in pinned or (c is None) == measured:
                continue
            s = pol.speeds(gs.geom, sc, [j])[j].get(pl.profile, 1.0)
            if j not in pol.est and pl.profile != full and \
                    pl.profile not in pol.learned.get(j, {}):
                s *= k
            w = pol.work.remaining(sc.state, j)
            saved = w / max(s, 0.05) - w - (c or 0.0)
            if (c is None or saved > c) and (best is None or (-saved, j) < best):
                best = (-saved, j)
        return best
    return best_donor


def reveal(sim: Simulator, job: str) -> None:
    """What a stint alone on a full GPU tells miso+: the job's full-GPU rate, which turns the
    rates already seen on its slices into speeds (as :mod:`~miso.sched.policies.observed` does
    for rates seen after the full-GPU one)."""
    pol = sim.policy
    if job in pol.ref_rate:
        return
    ref = pol.ref_rate[job] = sim.jobs[job].base_rate
    full = sim.geom.model.full_profile().name
    for prof, rate in sim.state.jobs[job].observed.items():
        if prof != full and job not in pol.est:
            pol.learned.setdefault(job, {})[prof] = max(0.01, min(1.5, rate / ref))


def measure_in_place(sim: Simulator, mode: str, meas_s: float, charge: bool,
                     skip: frozenset[str] = frozenset()) -> None:
    """Instrument ``sim``: jobs measured alone on a full GPU (module doc) as a layout is
    applied; ``skip``: jobs never measured (the oracle value-of-information gate)."""
    pol, cfg = sim.policy, sim.cfg
    seen: set[str] = set()
    orig = sim._exec

    def unmeasured(j: str) -> bool:
        return j not in pol.ref_rate and j not in pol.est and j not in skip

    def execute(now, d, gid=None):  # noqa: ANN001, ANN202
        if not isinstance(d, ApplyLayout):
            return orig(now, d, gid)
        restarts = (d.why or {}).get("restarts", [])
        shared = len(d.assignment) > 1
        new = [j for j in d.assignment if j not in seen and unmeasured(j) and shared]
        seen.update(d.assignment)
        if mode == "natural":  # only where the layout restarts someone anyway
            meas = [j for j in d.assignment if restarts and shared and unmeasured(j)
                    and (j in new or j in restarts)]
        else:
            meas = [j for j in new if mode in ("all", "cheapest") or restarts]
        tokens = {j: sim.jobs[j].token for j in d.assignment}
        out = orig(now, d, gid)
        for j in meas:
            reveal(sim, j)
        if not meas or not charge:
            return out
        extra = len(meas) * (meas_s + cfg.reconfig_s)
        stint = cheapest_gpu(sim, d.gpu, len(d.assignment) - len(meas)) \
            if mode == "cheapest" and not restarts else None
        if stint is not None:
            # The stint on a GPU with fewer jobs than this one: its jobs stop and restart
            # in place after it (two MIG reconfigurations); this GPU's jobs keep running.
            for jid in list(sim.state.gpus[stint].jobs):
                j = sim.jobs[jid]
                if j.finish is None and j.mode == "mig":
                    started = j.started
                    sim.stop_job(j, now)
                    wait = sim.restart(j, sim._share(j.placement)) if started else 0.0
                    sim._schedule_resume(j, now + 2 * cfg.reconfig_s + extra + wait)
        for jid, pl in d.assignment.items():
            j = sim.jobs[jid]
            restarted = j.token != tokens[jid]
            if jid in meas:
                # ran meas_s alone at full speed; restarts onto its slice unless the layout
                # restarted it anyway (then its restart is the one it had)
                j.work_left = max(1.0, j.work_left - meas_s)
                if not j.started:
                    j.started = True
                    j.first_start = now + cfg.reconfig_s
                    wait = sim.restart(j, sim._share(pl))
                elif restarted:
                    wait = j.restart_cost
                else:
                    sim.stop_job(j, now)
                    wait = sim.restart(j, sim._share(pl))
                sim._schedule_resume(j, now + 2 * cfg.reconfig_s + extra + wait)
            elif stint is not None:
                continue
            elif restarted:  # (re)started by the layout anyway: waits longer
                sim._schedule_resume(j, now + cfg.reconfig_s + extra
                                     + (j.restart_cost if j.started else 0.0))
            elif mode in ("all", "cheapest"):  # left running: stopped for the stint
                sim.stop_job(j, now)
                wait = sim.restart(j, sim._share(pl))
                sim._schedule_resume(j, now + cfg.reconfig_s + extra + wait)
        return out
    sim._exec = execute  # type: ignore[method-assign]


def cheapest_gpu(sim: Simulator, target: str, target_cost: int) -> str | None:
    """The GPU other than ``target`` with the fewest jobs and no plan in flight, when it has
    fewer than ``target_cost`` (then the stint stops fewer jobs there); else None."""
    best: tuple[int, str] | None = None
    for g, gs in sim.state.gpus.items():
        if g == target or gs.busy or sim.gpus[g].mode != "mig":
            continue
        if best is None or (len(gs.jobs), g) < best:
            best = (len(gs.jobs), g)
    return best[1] if best is not None and best[0] < target_cost else None


def in_place(gpus: int, restart: float, seed: int, mode: str, meas_s: float, charge: bool,
             family: str | None = None, skip_near: float | None = None,
             **policy: object) -> float:
    sim = simulator(gpus, restart, seed, family=family, **policy)
    skip: frozenset[str] = frozenset()
    if skip_near is not None:  # oracle gate: jobs whose true curve is near the prior
        skip = frozenset(j for j, sj in sim.jobs.items() if max(
            abs(sj.truth.get(p, v) - v)
            for p, v in prior_speeds(sim.geom, sj.spec.memory_gb).items()) < skip_near)
    measure_in_place(sim, mode, meas_s, charge, skip)
    return float(summarize(sim.run())["avg_jct_s"])


def ratio(values: list[float], true: list[float]) -> str:
    worst = max(a / b for a, b in zip(values, true, strict=True))
    return f"{np.mean(values) / np.mean(true):.3f} | {worst:.3f}"


def variant(gpus: int, restart: float, seed: int, kw: dict, family: str | None = None
            ) -> float:
    """miso+'s average JCT, held out, under one row's variant (see ``rows``)."""
    kw = dict(kw)
    if "mode" in kw:
        return in_place(gpus, restart, seed, kw.pop("mode"), kw.pop("meas", 10.0),
                        kw.pop("charge", True), family=family, **kw)
    saved = Rebalancing.best_donor
    if "prior" in kw:
        kw["estimates"] = (ScaledPrior(kw.pop("prior")),)
    if "donor" in kw:
        Rebalancing.best_donor = pessimistic_donor(kw.pop("donor"))  # type: ignore[method-assign]
    try:
        return avg_jct(gpus, restart, seed, "heldout", family=family, **kw)
    finally:
        Rebalancing.best_donor = saved  # type: ignore[method-assign]


LEARN = {"estimates": (LearnEarlierSlices(),)}
MEM = {"estimates": (MemoryPrior(),)}
BOTH = {"estimates": (MemoryPrior(), LearnEarlierSlices())}


def rows() -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [("miso+ as shipped", {}),
                                   ("+ learn_earlier_slices (new switch, off)", LEARN),
                                   ("+ memory_prior (new switch, off)", MEM),
                                   ("+ memory_prior + learn_earlier_slices", BOTH)]
    out += [(f"prior x{k} (every decision)", {"prior": k}) for k in (1.1, 0.9, 0.8, 0.7)]
    out += [(f"rebalance: unmeasured slice speed x{k}", {"donor": k}) for k in (0.85, 0.7, 0.5)]
    out += [(f"learn_earlier_slices + rebalance: unmeasured x{k}", {"donor": k, **LEARN})
            for k in (0.85, 0.7)]
    for mode in ("restart", "natural", "all", "cheapest"):
        if mode != "cheapest":
            out.append((f"in place, {mode}, free (upper bound)",
                        {"mode": mode, "charge": False, **LEARN}))
        for meas in (10.0, 3.0):
            out.append((f"in place, {mode}, {meas:.0f} s, charged",
                        {"mode": mode, "meas": meas, **LEARN}))
    for gap in (0.15, 0.25):
        out.append((f"in place, all, 10 s, charged, only jobs >= {gap} off the prior (oracle "
                    "gate)", {"mode": "all", "skip_near": gap, **LEARN}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--families", action="store_true",
                    help="per family trace (40 GPUs): before / after")
    ap.add_argument("--loss-only", action="store_true", help="only the loss by workload")
    ap.add_argument("--only", default="", help="only the rows whose label contains this "
                    "(and the shipped row); no loss table")
    args = ap.parse_args()
    seeds = range(1, args.seeds + 1)
    if args.families:
        cols = [("miso+ as shipped", {}), ("learn_earlier_slices", LEARN),
                ("memory_prior", MEM), ("both", BOTH)]
        print("| family F (40 GPUs, restart 30 s, every family new) | true s | "
              + " | ".join(f"{c} | worst seed" for c, _ in cols) + " |")
        print("|---|---|" + "---|---|" * len(cols))
        for f in families():
            true = [avg_jct(40, 30.0, s, "true", family=f) for s in seeds]
            cells = [ratio([variant(40, 30.0, s, kw, family=f) for s in seeds], true)
                     for _, kw in cols]
            print(f"| {f} | {np.mean(true):.0f} | {' | '.join(cells)} |", flush=True)
        return
    if not args.only:
        loss_by_workload()
    if args.loss_only:
        return
    for gpus, restart in SETTINGS:
        true = [avg_jct(gpus, restart, s, "true") for s in seeds]
        print(f"\n{gpus} GPUs, restart {restart:.0f} s: miso+ with true speeds "
              f"{np.mean(true):.0f} s\n")
        print("| variant | avg JCT s | ratio | worst seed |")
        print("|---|---|---|---|")
        for label, kw in rows():
            if args.only and args.only not in label and kw:
                continue
            v = [variant(gpus, restart, s, kw) for s in seeds]
            print(f"| {label} | {np.mean(v):.0f} | {ratio(v, true)} |", flush=True)


if __name__ == "__main__":
    main()
