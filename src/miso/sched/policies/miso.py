"""MISO (SoCC'22) and Oracle.

MISO: a new job goes to the least crowded GPU (at most 7 jobs, memory respected); the GPU runs
its mix under MPS for 3 x 10 s; predicted speeds (injected estimator) feed the exact optimizer;
the optimal layout is applied, checkpoint-restarting the jobs that move. When a job finishes the
GPU is re-optimised with the speeds already known (no unused slice). A job whose observed speed
departs from its baseline by more than ``speed_change_threshold`` is re-profiled, at most once
per ``reprofile_cooldown_s`` per GPU.

Oracle: the same policy with the true speeds and no profiling.

``miso+`` (ours) extends it: :mod:`miso.sched.policies.misoplus`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

from miso.mig import Geometry, Placement
from miso.optimize import optimizer_for
from miso.sched.decisions import ApplyLayout, RequeueCause, StartProfiling, WakeUp
from miso.sched.estimators import TrueSpeeds
from miso.sched.events import (
    JobSpeedChanged,
    ProfilingFinished,
    Tick,
)
from miso.sched.modelpref import model_order
from miso.sched.occupancy import Occupancy
from miso.sched.pinning import pinned_alone
from miso.sched.policies.base import (
    BasePolicy,
    Scratch,
    fit_classes,
    fitting_profiles,
    signature,
    signature_feasible,
)
from miso.sched.policies.framework import ENTITLEMENT, PREEMPT, RECLAIM, Filter, PostFilter
from miso.sched.policy import SpeedEstimator
from miso.sched.quotacap import capped_alone


class Miso(BasePolicy):
    """The MISO policy; see the module docstring. All knobs are constructor arguments."""

    name = "miso"
    #: fair share's filter and reclaim: an owner-aware policy (it shares GPUs)
    filters: tuple[Filter, ...] = (ENTITLEMENT,)
    post_filters: tuple[PostFilter, ...] = (RECLAIM, PREEMPT)

    def __init__(
        self,
        *,
        estimator: SpeedEstimator,
        max_jobs_per_gpu: int = 7,
        speed_change_threshold: float = 0.1,
        reprofile_cooldown_s: float = 600.0,
        profile_seconds_per_level: float = 10.0,
        objective: str = "throughput",
        restart_penalty: float = 0.0,
        model_aware: bool = True,
    ) -> None:
        if estimator is None:
            raise TypeError(f"policy {self.name!r} needs an estimator (estimator=...: "
                            f"miso.sched.make_estimator)")
        self.estimator: SpeedEstimator = estimator
        self.max_jobs = max_jobs_per_gpu
        self.threshold = speed_change_threshold
        self.cooldown = reprofile_cooldown_s
        self.profile_s = profile_seconds_per_level
        self.objective = objective
        self.restart_penalty = restart_penalty
        #: several GPU models: a job tries the models where it gains most first
        #: (:func:`miso.sched.modelpref.model_order`); False: GPU order alone (blind)
        self.model_aware = model_aware
        self.est: dict[str, dict[str, float]] = {}     # job -> profile -> speed
        self.stale: set[str] = set()                   # jobs that need a (re-)profile
        self.dirty: set[str] = set()                   # GPUs to re-plan once not busy
        self.last_profile: dict[str, float] = {}
        self.gpu_index: dict[str, int] = {}           # GPU -> the order it was added in
        # GPUs with room, by (resident jobs, geometry, residents' fitting profiles); tagged
        # (jobs, geometry, fitting profiles of a newcomer the mix admits).
        self.occ: Occupancy[Scratch] = Occupancy(self._occ_key, self._occ_tags)
        self._geoms: dict[Geometry, None] = {}
        #: per GPU, the last key and what it was computed from (:meth:`_occ_key`)
        self._keys: dict[str, tuple[object, list[str], int, Hashable | None]] = {}
        #: per (memory, workload, geometries seen) the tags by count (:meth:`_tags_by_count`)
        self._tag_lists: dict[tuple[object, ...], list[tuple[int, list[Hashable]]]] = {}

    # -- placement ------------------------------------------------------------------------
    def _occ_key(self, sc: Scratch, g: str) -> Hashable | None:
        st = sc.state
        gs = st.gpus[g]
        jobs = sc.jobs_on(g)
        replicas = len(st.services.by_gpu.get(g, ()))  # service replicas crowd it like jobs
        # The key is a function of the GPU (its geometry), its jobs (their memory: fixed per
        # job) and its replicas: a GPU re-keyed with the same ones (its plan or layout changed,
        # or it was touched twice) gets its last key without recomputing the signature.
        last = self._keys.get(g)
        if last is not None and last[0] is gs and last[1] == jobs and last[2] == replicas:
            return last[3]
        geom = gs.geom
        self._geoms[geom] = None
        n = len(jobs)
        key = None if n >= min(self.max_jobs, geom.model.max_instances) else (
            n + replicas, geom, signature(geom, [st.jobs[j].spec.memory_gb for j in jobs]))
        self._keys[g] = (gs, jobs, replicas, key)
        return key

    @staticmethod
    def _occ_tags(cls: Hashable) -> list[Hashable]:
        n, geom, sig = cls  # type: ignore[misc]
        return [(n, geom, f) for f in fit_classes(geom) if signature_feasible(geom, sig, f)]

    def candidate_gpus(self, sc: Scratch, job: str, index: Occupancy[Scratch] | None = None
                       ) -> Iterator[tuple[int, str]]:
        """(resident jobs, GPU) of every GPU that can hold ``job`` (room under
        ``max_jobs_per_gpu``, a valid layout for the mix): least crowded first, then GPU order.
        Lazy; consume it before the next placement or requeue. ``index``: an index whose tags
        are the policy's (a subset of its GPUs, e.g. those with a free slot: freeslots.py)."""
        occ = (self.occ if index is None else index).view(sc)
        cy = sc.cycle
        filtered = bool(cy.filters)
        for n, tags in self._tags_by_count(sc, job):
            for g in occ.ordered(tags):
                if not filtered or cy.allowed(job, g, sc.jobs_on(g)):
                    yield n, g

    def first_candidate(self, sc: Scratch, job: str) -> tuple[int, str] | None:
        """The first of :meth:`candidate_gpus`, without iterating."""
        if sc.cycle.filters:
            return next(self.candidate_gpus(sc, job), None)
        occ = self.occ.view(sc)
        for n, tags in self._tags_by_count(sc, job):
            g = occ.first(tags)
            if g is not None:
                return n, g
        return None

    def _tags_by_count(self, sc: Scratch, job: str) -> list[tuple[int, list[Hashable]]]:
        """Per resident count, least first, the tags of the classes that admit ``job``: a
        function of its memory, its workload (the model order) and the geometries seen so
        far, so remembered by them (the GPU order is the index's)."""
        spec = sc.state.jobs[job].spec
        key = (spec.memory_gb, spec.workload, len(self._geoms))
        got = self._tag_lists.get(key)
        if got is None:
            if len(self._tag_lists) >= 4096:  # many distinct memories: start afresh
                self._tag_lists.clear()
            got = self._tag_lists[key] = self._count_tags(spec.memory_gb, spec.workload)
        return got

    def _count_tags(self, mem: float, workload: str | None) -> list[tuple[int, list[Hashable]]]:
        multi = self.model_aware and len({g.model.name for g in self._geoms}) > 1
        fits = [(geom, fitting_profiles(geom, mem)) for geom in self._geoms]
        top = max((g.model.max_instances for g in self._geoms), default=0)
        if multi:
            rank = {g: i for i, g in enumerate(model_order(workload, list(self._geoms)))}
            fits.sort(key=lambda x: rank[x[0]])
            # at each crowding, the job's best model first
            return [(n, [(n, geom, f)]) for n in range(top) for geom, f in fits]
        return [(n, [(n, geom, f) for geom, f in fits]) for n in range(top)]

    def has_room(self, sc: Scratch, job: str) -> bool:
        """Whether some GPU could take ``job`` now (fair share's reclaim asks first)."""
        return self.first_candidate(sc, job) is not None

    def choose_gpu(self, now: float, job: str, sc: Scratch) -> str | None:
        """Least crowded GPU that can hold the job (count, then GPU order)."""
        got = self.first_candidate(sc, job)
        return None if got is None else got[1]

    def on_capacity(self, now: float, sc: Scratch) -> None:
        bound = sc.owner_bound()
        waiting: set[str] = set()
        jobs = sc.state.jobs
        for j in sc.iter_queue():
            if bound and jobs[j].spec.owner in waiting:
                continue
            g = self.choose_gpu(now, j, sc)
            if g is None:
                if not bound:
                    break  # FIFO: the head waits
                # Owners' GPUs differ: the head waits for its owner's jobs only.
                waiting.add(jobs[j].spec.owner)
                continue
            sc.place(j, g)
            self.dirty.add(g)
        self.replan_dirty(now, sc)

    def replan_dirty(self, now: float, sc: Scratch) -> None:
        """Re-plan the dirty GPUs without a plan in flight, in GPU order (a busy one stays
        dirty: :meth:`plannable`; no plan is acknowledged during a decision), left out before
        sorting so an event costs the GPUs that can be re-planned, not every busy one of a
        big cluster."""
        gpus = sc.state.gpus
        ready = [g for g in self.dirty if g not in gpus or not gpus[g].busy]
        for g in sorted(ready, key=lambda x: self.gpu_index.get(x, 0)):
            self.replan(now, g, sc)

    def on_gpu_added(self, now: float, gpu: str, sc: Scratch) -> None:
        self.gpu_index[gpu] = len(self.gpu_index)
        self.capacity(now, sc)

    def on_slices_changed(self, now: float, gpu: str, sc: Scratch) -> None:
        """Service replicas took or gave back slices of ``gpu``: re-plan it, place the queue."""
        self.dirty.add(gpu)
        self.capacity(now, sc)

    def replan_later(self, gpu: str) -> None:
        self.dirty.add(gpu)

    # -- planning -------------------------------------------------------------------------
    def plannable(self, g: str, sc: Scratch) -> bool:
        """True when ``g`` can be re-planned now; a busy GPU is marked dirty (re-planned once
        its pending plan is acknowledged), a removed one forgotten."""
        gs = sc.state.gpus.get(g)
        if gs is None:
            self.dirty.discard(g)
            return False
        if gs.busy:
            self.dirty.add(g)
            return False
        self.dirty.discard(g)
        return True

    def replan(self, now: float, g: str, sc: Scratch, force_solve: bool = False) -> None:
        if not self.plannable(g, sc):
            return
        st = sc.state
        gs = st.gpus[g]
        jobs = sc.jobs_on(g)
        if not jobs:
            return
        full = Placement(0, gs.geom.model.full_profile().name)
        if len(jobs) == 1 and gs.base is None:  # (beside service replicas: the optimizer)
            # Alone: the full GPU is optimal whatever the speeds; no profiling needed.
            full = capped_alone(st, g, jobs[0], full)  # (or what its owner's quota allows)
            full = pinned_alone(st, g, jobs[0], full)  # (or the profile it is pinned to)
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
        speeds = sc.entitled_speeds(g, speeds)
        current = {j: pl for j, pl in gs.assignment.items() if j in speeds}
        sol = optimizer_for(gs.geom).try_solve(
            speeds, current=current, objective=self.objective,
            restart_penalty=self.restart_penalty)
        if sol is None:
            for j in jobs[-1:]:
                sc.requeue(j, "no layout holds the mix", cause=RequeueCause.NO_LAYOUT)
            return
        lay = tuple(sorted(sol.layout))
        if lay == tuple(sorted(gs.layout)) and sol.assignment == gs.assignment:
            return
        sc.out.append(ApplyLayout(g, st.new_plan_id(), lay, dict(sol.assignment)))

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
        # The estimator's records of the job (the predictor's std and interval), read only by
        # explanations: without this they grow with every job a long run has seen.
        self.estimator.uncertainty.pop(job, None)
        getattr(self.estimator, "interval", {}).pop(job, None)
        if gpu is not None and gpu in sc.state.gpus:
            self.dirty.add(gpu)
        self.capacity(now, sc)

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


class Oracle(Miso):
    """MISO with the true per-profile speeds and no profiling cost (it takes MISO's options
    except ``estimator``)."""

    name = "oracle"

    def __init__(self, **miso_options: Any) -> None:
        if "estimator" in miso_options:
            raise TypeError("policy 'oracle' has no option 'estimator' (it uses the true "
                            "speeds)")
        super().__init__(estimator=TrueSpeeds(), **miso_options)


def oracle(**miso_options: Any) -> Miso:
    """:class:`Oracle` (the old factory spelling)."""
    return Oracle(**miso_options)
