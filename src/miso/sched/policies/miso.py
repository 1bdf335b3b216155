"""MISO (SoCC'22), Oracle, and ``miso+`` (ours).

MISO: a new job goes to the least crowded GPU (at most 7 jobs, memory respected); the GPU runs
its mix under MPS for 3 x 10 s; predicted speeds (injected estimator) feed the exact optimizer;
the optimal layout is applied, checkpoint-restarting the jobs that move. When a job finishes the
GPU is re-optimised with the speeds already known (no unused slice). A job whose observed speed
departs from its baseline by more than ``speed_change_threshold`` is re-profiled, at most once
per ``reprofile_cooldown_s`` per GPU.

Oracle: the same policy with the true speeds and no profiling.

``miso+``: see :class:`MisoPlus`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from miso.mig import Geometry, Placement
from miso.optimize import OptimizerError, optimizer_for
from miso.sched.decisions import ApplyLayout, StartProfiling, WakeUp
from miso.sched.estimators import NoisyOracle, TrueSpeeds
from miso.sched.events import JobSpeedChanged, ProfilingFinished, SpeedObserved, Tick
from miso.sched.occupancy import Occupancy
from miso.sched.policies.base import (
    BasePolicy,
    Scratch,
    fit_classes,
    fitting_profiles,
    mix_feasible,
    signature,
    signature_feasible,
)
from miso.sched.policy import SpeedEstimator, register


@register("miso")
class Miso(BasePolicy):
    """The MISO policy; see the module docstring. All knobs are constructor arguments."""

    name = "miso"

    def __init__(
        self,
        estimator: SpeedEstimator | None = None,
        max_jobs_per_gpu: int = 7,
        speed_change_threshold: float = 0.1,
        reprofile_cooldown_s: float = 600.0,
        profile_seconds_per_level: float = 10.0,
        objective: str = "throughput",
        restart_penalty: float = 0.0,
        **_: object,
    ) -> None:
        self.estimator: SpeedEstimator = estimator if estimator is not None else NoisyOracle()
        self.max_jobs = max_jobs_per_gpu
        self.threshold = speed_change_threshold
        self.cooldown = reprofile_cooldown_s
        self.profile_s = profile_seconds_per_level
        self.objective = objective
        self.restart_penalty = restart_penalty
        self.est: dict[str, dict[str, float]] = {}     # job -> profile -> speed
        self.stale: set[str] = set()                   # jobs that need a (re-)profile
        self.dirty: set[str] = set()                   # GPUs to re-plan once not busy
        self.last_profile: dict[str, float] = {}
        self._order: dict[str, int] = {}
        # GPUs with room, by (resident jobs, geometry, residents' fitting profiles); tagged
        # (jobs, geometry, fitting profiles of a newcomer the mix admits).
        self.occ: Occupancy[Scratch] = Occupancy(self._occ_key, self._occ_tags)
        self._geoms: dict[Geometry, None] = {}

    # -- placement ------------------------------------------------------------------------
    def levels(self, sc: Scratch) -> list[list[str]]:
        """GPUs bucketed by resident job count (0..7), each bucket in GPU order; O(GPUs)."""
        st = sc.state
        slow = bool(sc.extra or sc.requeued)
        buckets: list[list[str]] = [[] for _ in range(8)]
        for g, gs in st.gpus.items():
            n = len(sc.jobs_on(g)) if slow else len(gs.jobs)
            buckets[min(n, 7)].append(g)
        return buckets

    def _occ_key(self, sc: Scratch, g: str) -> Hashable | None:
        geom = sc.state.gpus[g].geom
        self._geoms[geom] = None
        jobs = sc.jobs_on(g)
        n = len(jobs)
        if n >= min(self.max_jobs, geom.model.max_instances):
            return None
        return (n, geom, signature(geom, [sc.state.jobs[j].spec.memory_gb for j in jobs]))

    @staticmethod
    def _occ_tags(cls: Hashable) -> list[Hashable]:
        n, geom, sig = cls  # type: ignore[misc]
        return [(n, geom, f) for f in fit_classes(geom) if signature_feasible(geom, sig, f)]

    def candidate_gpus(self, sc: Scratch, job: str) -> Iterator[tuple[int, str]]:
        """(resident jobs, GPU) of every GPU that can hold ``job`` (room under
        ``max_jobs_per_gpu``, a valid layout for the mix): least crowded first, then GPU order.
        Lazy; consume it before the next placement or requeue."""
        occ = self.occ.view(sc)
        mem = sc.state.jobs[job].spec.memory_gb
        fits = [(geom, fitting_profiles(geom, mem)) for geom in self._geoms]
        for n in range(max((g.model.max_instances for g in self._geoms), default=0)):
            for g in occ.ordered([(n, geom, f) for geom, f in fits]):
                yield n, g

    def choose_gpu(self, now: float, job: str, sc: Scratch) -> str | None:
        """Least crowded GPU that can hold the job (count, then GPU order)."""
        for _, g in self.candidate_gpus(sc, job):
            return g
        return None

    def on_capacity(self, now: float, sc: Scratch) -> None:
        for j in sc.queue():
            g = self.choose_gpu(now, j, sc)
            if g is None:
                break  # FIFO: the head waits
            sc.place(j, g)
            self.dirty.add(g)
        for g in sorted(self.dirty, key=lambda x: self._order.get(x, 0)):
            self.replan(now, g, sc)

    def on_gpu_added(self, now: float, gpu: str, sc: Scratch) -> None:
        self._order[gpu] = len(self._order)
        self.on_capacity(now, sc)

    # -- planning -------------------------------------------------------------------------
    def replan(self, now: float, g: str, sc: Scratch, force_solve: bool = False) -> None:
        st = sc.state
        gs = st.gpus.get(g)
        if gs is None:
            self.dirty.discard(g)
            return
        if gs.busy:
            self.dirty.add(g)
            return
        self.dirty.discard(g)
        jobs = sc.jobs_on(g)
        if not jobs:
            return
        full = Placement(0, gs.geom.model.full_profile().name)
        if len(jobs) == 1:
            # Alone: the full GPU is optimal whatever the speeds; no profiling needed.
            if gs.layout != (full,) or gs.assignment.get(jobs[0]) != full:
                sc.out.append(ApplyLayout(g, st.new_plan_id(), (full,), {jobs[0]: full}))
            return
        if self.estimator.needs_profile and not force_solve and any(
                j not in self.est or j in self.stale for j in jobs):
            pid = st.new_plan_id()
            sc.out.append(StartProfiling(g, pid, tuple(jobs),
                                         seconds_per_level=self.profile_s))
            self.last_profile[g] = now
            return
        speeds = self.speeds_for(now, g, jobs, sc)
        self.solve_and_apply(now, g, jobs, speeds, sc)

    def speeds_for(self, now: float, g: str, jobs: list[str], sc: Scratch
                   ) -> dict[str, dict[str, float]]:
        st = sc.state
        missing = [j for j in jobs if j not in self.est]
        if missing:  # only estimators without profiling get here
            geom = st.gpus[g].geom
            self.est.update(self.estimator.estimate(geom, [st.jobs[j] for j in missing]))
        return {j: self.est[j] for j in jobs}

    def solve_and_apply(self, now: float, g: str, jobs: list[str],
                        speeds: dict[str, dict[str, float]], sc: Scratch) -> None:
        st = sc.state
        gs = st.gpus[g]
        current = {j: pl for j, pl in gs.assignment.items() if j in speeds}
        try:
            sol = optimizer_for(gs.geom).solve(
                speeds, current=current, objective=self.objective_for(now, g, jobs, sc),
                restart_penalty=self.penalty_for(now, g, jobs, sc))
        except OptimizerError:
            for j in jobs[-1:]:
                sc.requeue(j, "no layout holds the mix")
            return
        lay = tuple(sorted(sol.layout))
        if lay == tuple(sorted(gs.layout)) and sol.assignment == gs.assignment:
            return
        sc.out.append(ApplyLayout(g, st.new_plan_id(), lay, dict(sol.assignment)))

    def objective_for(self, now: float, g: str, jobs: list[str], sc: Scratch) -> str:
        return self.objective

    def penalty_for(self, now: float, g: str, jobs: list[str], sc: Scratch) -> float:
        return self.restart_penalty

    # -- events ---------------------------------------------------------------------------
    def on_profiled(self, now: float, ev: ProfilingFinished, sc: Scratch) -> None:
        st = sc.state
        gs = st.gpus[ev.gpu]
        jobs = [j for j in sc.jobs_on(ev.gpu) if j in ev.speeds]
        if jobs:
            self.est.update(self.estimator.estimate(
                gs.geom, [st.jobs[j] for j in jobs], ev.speeds))
            self.stale.difference_update(jobs)
        self.replan(now, ev.gpu, sc, force_solve=all(j in self.est
                                                     for j in sc.jobs_on(ev.gpu)))

    def on_applied(self, now: float, gpu: str, sc: Scratch) -> None:
        if gpu in self.dirty:
            self.replan(now, gpu, sc)

    def on_finish(self, now: float, job: str, gpu: str | None, sc: Scratch) -> None:
        self.est.pop(job, None)
        self.stale.discard(job)
        if gpu is not None and gpu in sc.state.gpus:
            self.dirty.add(gpu)
        self.on_capacity(now, sc)

    def on_speed_changed(self, now: float, ev: JobSpeedChanged, sc: Scratch) -> None:
        if ev.baseline <= 0 or abs(ev.observed / ev.baseline - 1.0) <= self.threshold:
            return
        if not self.estimator.needs_profile:
            self.est.pop(ev.job, None)
        self.stale.add(ev.job)
        last = self.last_profile.get(ev.gpu, -1e18)
        if now - last < self.cooldown:
            sc.out.append(WakeUp(last + self.cooldown, f"reprofile:{ev.gpu}"))
            return
        self.dirty.add(ev.gpu)
        self.replan(now, ev.gpu, sc)

    def on_tick(self, now: float, ev: Tick, sc: Scratch) -> None:
        if ev.tag.startswith("reprofile:"):
            g = ev.tag.split(":", 1)[1]
            if g in sc.state.gpus and any(j in self.stale for j in sc.jobs_on(g)):
                self.replan(now, g, sc)


@register("oracle")
def oracle(**kw: object) -> Miso:
    """MISO with the true per-profile speeds and no profiling cost."""
    kw = {k: v for k, v in kw.items() if k != "estimator"}
    p = Miso(estimator=TrueSpeeds(), **kw)  # type: ignore[arg-type]
    p.name = "oracle"
    return p


@register("miso+")
class MisoPlus(Miso):
    """Ours. Changes to MISO, each a switch so its effect can be measured:

    * ``restart_aware``: a re-optimisation with running jobs (after a job finishes) maximises
      throughput minus ``restart_s / horizon_s`` per moved job, so jobs whose slice would change
      for a small gain keep running (only jobs whose instance changes are restarted).
    * ``observed_correction``: observed MIG rates (``SpeedObserved``) replace predictions once
      the job's full-GPU rate is known.
    * ``pack_on_finish``: see :meth:`on_finish` (defer re-optimisation while jobs queue).
    """

    name = "miso+"

    def __init__(self, restart_aware: bool = True, restart_s: float = 30.0,
                 horizon_s: float = 1800.0, observed_correction: bool = True,
                 las_scale_s: float | None = None, las_power: float = 1.0,
                 rebalance: bool = True, rebalance_min_gain: float = 0.2,
                 marginal_placement: bool = True, marginal_candidates: int = 16,
                 **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.marginal_placement = marginal_placement
        self.marginal_candidates = marginal_candidates
        self.rebalance = rebalance
        self.rebalance_min_gain = rebalance_min_gain
        self.las_scale_s = las_scale_s
        self.las_power = las_power
        self.placed_at: dict[str, float] = {}
        self.restart_aware = restart_aware
        self.restart_s = restart_s
        self.horizon_s = horizon_s
        self.observed_correction = observed_correction
        self.ref_rate: dict[str, float] = {}

    def objective_for(self, now: float, g: str, jobs: list[str], sc: Scratch) -> str:
        if self.restart_aware and sc.state.gpus[g].assignment:
            return "restart-aware"
        return self.objective

    def penalty_for(self, now: float, g: str, jobs: list[str], sc: Scratch) -> float:
        return self.restart_s / self.horizon_s if self.restart_aware else self.restart_penalty

    def on_speed_observed(self, now: float, ev: SpeedObserved, sc: Scratch) -> None:
        if not self.observed_correction:
            return
        gs = sc.state.gpus.get(ev.gpu)
        if gs is None:
            return
        full = gs.geom.model.full_profile().name
        if ev.placement.profile == full:
            self.ref_rate[ev.job] = ev.rate
        ref = self.ref_rate.get(ev.job)
        if ref and ev.job in self.est:
            obs = sc.state.jobs[ev.job].observed
            for prof, r in obs.items():
                if prof in self.est[ev.job]:
                    self.est[ev.job][prof] = max(0.01, min(1.5, r / ref))

    def on_finish(self, now: float, job: str, gpu: str | None, sc: Scratch) -> None:
        self.ref_rate.pop(job, None)
        self.placed_at.pop(job, None)
        super().on_finish(now, job, gpu, sc)
        if self.rebalance:
            self.fill_idle_gpus(now, sc)

    def _prior(self, gs_geom: object, mem: float) -> dict[str, float]:
        """Catalogue-average speed per fitting profile: the guess for a job not profiled yet."""
        from miso.sched.speeds import workload_speeds
        from miso.workloads import catalogue

        key = (id(gs_geom), round(mem, 3))
        got = self._priors.get(key) if hasattr(self, "_priors") else None
        if got is None:
            if not hasattr(self, "_priors"):
                self._priors: dict[tuple[int, float], dict[str, float]] = {}
            acc: dict[str, list[float]] = {}
            for w in catalogue().values():
                for p, s in workload_speeds(gs_geom, w).items():  # type: ignore[arg-type]
                    acc.setdefault(p, []).append(s)
            fit = set(fitting_profiles(gs_geom, mem))  # type: ignore[arg-type]
            got = {p: sum(v) / len(v) for p, v in acc.items() if p in fit}
            self._priors[key] = got
        return got

    def choose_gpu(self, now: float, job: str, sc: Scratch) -> str | None:
        """Among the least crowded GPUs that can hold the job, the one where the predicted
        throughput gain of adding it (catalogue-average prior for the new job, estimates for
        the residents) is largest."""
        if not self.marginal_placement:
            return super().choose_gpu(now, job, sc)
        st = sc.state
        mem = st.jobs[job].spec.memory_gb
        for n, bucket in enumerate(self.levels(sc)):
            best: tuple[float, str] | None = None
            seen = 0
            for g in bucket:
                gs = st.gpus[g]
                if n >= min(self.max_jobs, gs.geom.model.max_instances):
                    continue
                jobs = sc.jobs_on(g)
                mems = [st.jobs[j].spec.memory_gb for j in jobs] + [mem]
                if not mix_feasible(gs.geom, mems):
                    continue
                if n == 0:
                    return g
                if any(j not in self.est for j in jobs):
                    gain = -1.0  # unknown residents: least preferred among equals
                else:
                    opt = optimizer_for(gs.geom)
                    sp = {j: self.est[j] for j in jobs}
                    try:
                        before = opt.solve(sp).throughput
                        sp[job] = self._prior(gs.geom, mem)
                        gain = opt.solve(sp).throughput - before
                    except OptimizerError:
                        continue
                if best is None or gain > best[0] + 1e-9:
                    best = (gain, g)
                seen += 1
                if seen >= self.marginal_candidates:
                    break
            if best is not None:
                return best[1]
        return None

    def fill_idle_gpus(self, now: float, sc: Scratch) -> None:
        """Move the slowest job of a crowded GPU onto a GPU that became empty (while nothing
        queues): it gets the whole GPU and its old neighbours grow into the freed slices."""
        st = sc.state
        if sc.queue():
            return
        idle = [g for g, gs in st.gpus.items() if not gs.busy and not sc.jobs_on(g)]
        if not idle:
            return
        donors: list[tuple[float, int, str, str]] = []
        for g, gs in st.gpus.items():
            jobs = sc.jobs_on(g)
            if len(jobs) < 2 or gs.busy or any(j not in self.est for j in jobs):
                continue
            for j in jobs:
                pl = gs.assignment.get(j)
                if pl is None:
                    continue
                gain = 1.0 - self.est[j].get(pl.profile, 1.0)
                if gain >= self.rebalance_min_gain:
                    donors.append((-gain, -len(jobs), j, g))
        donors.sort()
        used: set[str] = set()
        for target in idle:
            while donors and donors[0][3] in used:
                donors.pop(0)
            if not donors:
                return
            _, _, j, src = donors.pop(0)
            used.add(src)
            sc.requeue(j, f"rebalance to idle {target}")
            sc.place(j, target)
            full = Placement(0, st.gpus[target].geom.model.full_profile().name)
            sc.out.append(ApplyLayout(target, st.new_plan_id(), (full,), {j: full}))
            self.replan(now, src, sc)

    def solve_and_apply(self, now: float, g: str, jobs: list[str],
                        speeds: dict[str, dict[str, float]], sc: Scratch) -> None:
        if self.las_scale_s:
            w = {}
            for j in jobs:
                age = max(0.0, now - self.placed_at.setdefault(j, now))
                w[j] = (1.0 + age / self.las_scale_s) ** (-self.las_power)
            speeds = {j: {p: max(1e-3, s * w[j]) for p, s in sp.items()}
                      for j, sp in speeds.items()}
        super().solve_and_apply(now, g, jobs, speeds, sc)
