"""Tenancy: who owns each job, how much of the cluster each owner has used, and in which order
waiting jobs are offered to the policy (fair share, priorities, in-use quotas). Pure: no I/O.

One mechanism for every policy: a :class:`~miso.sched.tenancyconfig.TenancyConfig` (what an
operator sets, with the priority classes: :mod:`miso.sched.tenancyconfig`) given to the driver's
:class:`~miso.sched.state.ClusterState` turns it on; policies read the queue through
:class:`~miso.sched.policies.base.Scratch`, which asks :meth:`Tenancy.order` for it. With no
config the queue stays FIFO and nothing here runs.

**Usage unit: GPU-equivalents x seconds.** A job holding a MIG slice is charged the slice's
share of the GPU's compute, ``compute_slices(profile) / compute_slices(full profile)`` (a 3g
slice of an A100 is 3/7 of a GPU, a 1g slice 1/7), for as long as it holds it; under MPS its
active-thread share (50 % = 0.5); resident on a GPU without a slice yet (placed, profiling) an
equal part of the GPU (1/n of n resident jobs). Compute slices, not memory or instance counts,
because they are what a job's speed is bought with: the same count of 1g slices and 7g slices
are not the same resource (Kueue had to learn this, kueue#10108; KAI counted MIG pods as 0 GPUs).
With several GPU models the unit is a GPU of the first model announced: a slice of another
model is charged its compute share times the models' hardware ratio
(:func:`miso.sched.modelspeed.hardware_ratio`; an H100-80GB GPU is 2.61 A100-40GB GPUs), so a
share buys the same speed wherever a job runs (model-neutral; one model: unchanged).
An owner's usage decays with a half-life ``half_life_s`` (Slurm's ``PriorityDecayHalfLife``):
``U(t) = sum over held intervals of charge x dt x 2^(-(t - t_dt) / half_life)``, integrated
exactly between changes (a charge is constant between two state changes).

**Queue order, quotas, priorities:** :mod:`miso.sched.fairorder` (fair share's ``u/w``
order, in-use and queued-jobs quotas).

**Entitlements (fair share decides sizes too, ``reclaim``, on with fair share):** ordering
alone starts an under-served owner's job sooner but on whatever slice frees, typically a 1g
slice beside six jobs of the owner that fills the cluster (measured: the light owner of a
80/20 pair got 2.4x its JCT alone on half the cluster). So each owner is entitled to a number
of GPUs, max-min fair by weight over its demand (water-filling: an owner with ``n`` active jobs
demands ``max(1, demand_per_job x n)`` GPUs, at most ``n``; what it does not need is shared
out among the others by weight), and an owner's *holding* counts each occupied GPU once, split
among the owners of its jobs by their charges. An owner holding no more than its entitlement
``E`` (plus ``keep_margin``) with ``n`` active jobs is *protected*: each of its jobs is owed a
*fair slice*, the largest profile of at most ``min(demand_per_job, E / n)`` of a GPU. A job may
join a GPU only where a layout still gives every protected job there its fair slice
(:meth:`miso.sched.policies.base.Scratch.may_join`), the optimizer is offered only slices at
least that large for those jobs (:meth:`~miso.sched.policies.base.Scratch.entitled_speeds`), and
:mod:`miso.sched.policies.reclaim` returns room lent to owners above their entitlement to a
waiting protected owner by checkpointing and requeueing their jobs (Kueue's
``reclaimWithinCohort``). Off with ``reclaim=False`` (order only).
On several GPU models entitlements, demands and holdings are in the usage's model-neutral unit
(:meth:`Tenancy.capacity`: a GPU counts its model's weight, a demand of ``k`` GPUs is ``k``
average GPUs); counted in GPUs, an owner at its entitlement could hold far fewer units than its
weight (measured, 8 A100-40GB + 8 H100-80GB, owners 2:1, seed 1: -13.8 % / +27.5 % of their
weights counted in GPUs, -0.6 % / +1.1 % in the unit).

**A stated price** (``fairness_price``, issue 31): the fair slice's cap then follows the
cluster's backlog instead of ``demand_per_job`` (:mod:`miso.sched.fairprice`,
:class:`~miso.sched.fairprice.FairSlices`: :meth:`Tenancy.plan_budget` once per decision,
:attr:`Tenancy.budget` for the status), and reclaim acts only when the fair slice beats what
packing gives (:mod:`miso.sched.policies.reclaim`).

**Accounts** (``accounts``, ``account_weights``; Slurm's association tree, two levels):
entitlements are water-filled between accounts, then between the owners of each
(:mod:`miso.sched.fairfill`), and the queue goes by the account's ``u/w`` first, then the
owner's. An owner in no account is an account of its own (one level, as before). With
accounts an owner with jobs waiting demands at least what it holds plus their smallest
slices (:func:`~miso.sched.fairfill.floored`: a waiting job is demand not met).

**Durable usage:** the ledger is exactly described, between two changes of the owners'
charges, by each owner's usage as of the last change and its charge since
(:meth:`Tenancy.ledger`, :class:`UsageRecord`); a driver that keeps these records at every
change can carry the ledger across a restart (:meth:`Tenancy.restore`; the live controller
does, :mod:`miso.controller.usagestore`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from miso.sched import fairorder
from miso.sched.fairfill import floored, two_level_fill, water_fill
from miso.sched.fairprice import Backlog, FairBudget, FairSlices
from miso.sched.quotacap import reserved_charge
from miso.sched.tenancyconfig import TenancyConfig

__all__ = ["Tenancy", "UsageRecord", "job_charge", "two_level_fill", "water_fill"]

if TYPE_CHECKING:  # pragma: no cover
    from miso.mig import Geometry
    from miso.sched.state import ClusterState, GpuState


def job_charge(gs: GpuState, job: str) -> float:
    """GPU-equivalents ``job`` holds on ``gs`` (see the module docstring)."""
    model = gs.geom.model
    pl = gs.target_assignment().get(job)
    if pl is not None:
        return model.profile(pl.profile).compute_slices / model.full_profile().compute_slices
    share = gs.mps_shares.get(job)
    if share is not None:
        return share / 100.0
    return 1.0 / max(1, len(gs.jobs))


@dataclass(frozen=True)
class UsageRecord:
    """One owner's ledger as of ``as_of``: its decayed usage (GPU-equivalent-seconds), its
    undecayed total, the GPU-equivalents it held from then on (``rate``) and the half-life the
    usage decays with. Exact until the owner's charge next changes."""

    owner: str
    usage: float
    total: float
    rate: float
    as_of: float
    half_life_s: float

    def settled(self, t: float) -> UsageRecord:
        """This record carried to ``t`` (charged ``rate`` until then, decayed by its
        half-life; ``t`` before ``as_of``: unchanged), holding nothing from ``t`` on: the
        ledger of an owner whose jobs stopped at ``t`` (a restart's recovery stops them all)."""
        dt = max(0.0, t - self.as_of)
        k = math.log(2.0) / self.half_life_s
        d = math.exp(-k * dt)
        return UsageRecord(self.owner, self.usage * d + self.rate * (1.0 - d) / k,
                           self.total + self.rate * dt, 0.0, max(t, self.as_of),
                           self.half_life_s)


class Tenancy:
    """Per-owner usage ledger kept from the cluster state's changes, and the queue order."""

    def __init__(self, config: TenancyConfig, state: ClusterState) -> None:
        self.config = config
        self.state = state
        self._k = math.log(2.0) / config.half_life_s
        self.t = 0.0
        self.usage: dict[str, float] = {}      # decayed GPU-equivalent-seconds, as of ``t``
        self.total: dict[str, float] = {}      # undecayed GPU-equivalent-seconds, as of ``t``
        self.in_use: dict[str, float] = {}     # GPU-equivalents held now
        self._held: dict[str, dict[str, tuple[str, float]]] = {}   # gpu -> job -> charge
        #: job -> time it last started running (preemption's minimum run time)
        self.running_since: dict[str, float] = {}
        #: queued job -> why it is not offered to the policy (quota), refreshed by ``order``
        self.waiting: dict[str, str] = {}
        self._geoms: dict[Geometry, None] = {}    # GPU geometries seen (smallest slices)
        self._smallest: dict[float, float] = {}   # memory -> smallest fitting charge
        #: the policy gives whole GPUs only (``nopart``): a job's smallest charge is 1.0, so
        #: an in-use quota caps whole GPUs (set by the driver from the policy's
        #: ``whole_gpus_only``)
        self.whole_gpus = False
        #: GPUs held per owner: each occupied GPU counts its model's weight (1 on one model),
        #: split by its owners' charges
        self.held: dict[str, float] = {}
        self._split: dict[str, dict[str, float]] = {}   # gpu -> owner -> its part x weight
        #: resident jobs per owner (the demand of :meth:`entitlements`, with the queued ones)
        self.resident: dict[str, int] = {}
        #: gpu -> replica -> (owner, charge): service replicas' slices, charged to their owner
        self._replicas: dict[str, dict[str, tuple[str, float]]] = {}
        #: the fair slices' cap as the load moves, and reclaim's rate limit (fairprice.py)
        self.slices = FairSlices(config)
        state.watch(self._changed)

    @property
    def backlog(self) -> Backlog:
        """Active jobs per GPU, time-averaged (the fair slices' load signal)."""
        return self.slices.backlog

    @property
    def budget(self) -> FairBudget | None:
        """The regime and fair slice cap of the last decision (None: no price stated)."""
        return self.slices.budget

    @property
    def reclaimed_at(self) -> dict[str, float]:
        """GPU -> when fair share last returned room on it (reclaim's rate limit)."""
        return self.slices.reclaimed_at

    # -- the ledger ---------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Integrate every owner's charge up to ``now`` (exact: charges are constant between
        state changes)."""
        dt = now - self.t
        if dt <= 0:
            return
        d = math.exp(-self._k * dt)
        for o in set(self.usage) | set(self.in_use):
            r = self.in_use.get(o, 0.0)
            self.usage[o] = self.usage.get(o, 0.0) * d + r * (1.0 - d) / self._k
            self.total[o] = self.total.get(o, 0.0) + r * dt
        self.t = now

    def usage_at(self, owner: str, now: float) -> float:
        """Decayed usage of ``owner`` at ``now`` (GPU-equivalent-seconds)."""
        dt = max(0.0, now - self.t)
        d = math.exp(-self._k * dt)
        return self.usage.get(owner, 0.0) * d + self.in_use.get(owner, 0.0) * (1.0 - d) / self._k

    def _forget(self, g: str) -> None:
        """Take what ``g`` held out of the owners' counts (before counting it again)."""
        st = self.state
        for j, (o, c) in self._held.pop(g, {}).items():
            self.in_use[o] = self.in_use.get(o, 0.0) - c
            if abs(self.in_use[o]) < 1e-12:
                self.in_use[o] = 0.0
            self.resident[o] -= 1
            if j not in st.jobs or st.jobs[j].gpu != g or st.jobs[j].status.value != "running":
                self.running_since.pop(j, None)
        for o, c in self._replicas.pop(g, {}).values():
            self.in_use[o] = self.in_use.get(o, 0.0) - c
            if abs(self.in_use[o]) < 1e-12:
                self.in_use[o] = 0.0
        for o, part in self._split.pop(g, {}).items():
            self.held[o] -= part
            if abs(self.held[o]) < 1e-12:
                self.held[o] = 0.0

    def _changed(self, g: str) -> None:
        st = self.state
        self.advance(st.now)
        self._forget(g)
        gs = st.gpus.get(g) or st.gangs.gpus.get(g)  # held GPUs: whole-GPU runs, draining
        if gs is None:
            return
        if gs.geom not in self._geoms:
            self._geoms[gs.geom] = None
            self._smallest = {}
        held = {}
        weight = self.model_weight(gs.model)
        for j in gs.jobs:
            js = st.jobs[j]
            c = job_charge(gs, j) * weight
            if self.config.max_in_use:  # a capped owner's job waiting for its slice
                c = reserved_charge(self, gs, j, c)
            held[j] = (js.spec.owner, c)
            self.in_use[js.spec.owner] = self.in_use.get(js.spec.owner, 0.0) + c
            self.resident[js.spec.owner] = self.resident.get(js.spec.owner, 0) + 1
            if js.status.value == "running":
                self.running_since.setdefault(j, st.now)
            else:
                self.running_since.pop(j, None)
        self._held[g] = held
        self._charge_replicas(g, gs, weight)
        if held:
            split: dict[str, float] = {}
            tot = sum(c for _, c in held.values())
            for o, c in held.values():
                # the GPU counts its weight (the model-neutral unit)
                split[o] = split.get(o, 0.0) + weight * (c / tot if tot > 0 else 1.0 / len(held))
            for o, part in split.items():
                self.held[o] = self.held.get(o, 0.0) + part
            self._split[g] = split
        self._sample_backlog()

    def _charge_replicas(self, g: str, gs: GpuState, weight: float) -> None:
        """A replica's slice counts against its owner like a job's instance."""
        reps = self.state.services.on_gpu(g)
        if not reps:
            return
        base = (gs.base or gs.geom).model
        full = base.full_profile().compute_slices
        rc = {r.id: (r.owner, base.profile(r.slot.profile).compute_slices / full * weight)
              for r in reps}
        for o, c in rc.values():
            self.in_use[o] = self.in_use.get(o, 0.0) + c
        self._replicas[g] = rc

    def _sample_backlog(self) -> None:
        st = self.state
        self.backlog.sample(st.now, len(st.queue) + sum(self.resident.values()),
                            len(st.gpus))

    def model_weight(self, model: str) -> float:
        """GPU-equivalents (of the first GPU model seen) one GPU of ``model`` is charged
        (module docstring): 1.0 on a one-model cluster."""
        first = next(iter(self._geoms)).model.name
        if model == first:
            return 1.0
        from miso.sched.modelspeed import hardware_ratio

        return hardware_ratio(model) / hardware_ratio(first)

    def ledger(self) -> list[UsageRecord]:
        """Every owner's usage as of the last change and its charge since (what a driver
        keeps to carry the ledger across a restart; exact until the next change)."""
        hl = self.config.half_life_s
        return [UsageRecord(o, self.usage.get(o, 0.0), self.total.get(o, 0.0),
                            self.in_use.get(o, 0.0), self.t, hl)
                for o in sorted(set(self.usage) | set(self.in_use))]

    def restore(self, records: Iterable[UsageRecord], now: float) -> None:
        """Start the ledger from ``records`` (a previous ledger), each settled at ``now`` (its
        owner's jobs held their charge until then; the restored usage decays with this
        config's half-life from ``now`` on). Only before any job is resident: ValueError
        otherwise."""
        if any(c for c in self.in_use.values()):
            raise ValueError("restore: jobs already hold GPUs; restore before placing any")
        for r in records:
            s = r.settled(now)
            self.usage[r.owner] = s.usage
            self.total[r.owner] = s.total
        self.t = max(self.t, now)

    def note_owner(self, owner: str) -> None:
        """An owner submitted a job (it appears in the reports with zero usage)."""
        self.usage.setdefault(owner, 0.0)
        self.total.setdefault(owner, 0.0)
        self._sample_backlog()

    def charge_of(self, job: str) -> float:
        """GPU-equivalents ``job`` holds now (0 when queued)."""
        g = self.state.jobs[job].gpu
        return self._held.get(g, {}).get(job, ("", 0.0))[1] if g is not None else 0.0

    def split_of(self, gpu: str) -> dict[str, float]:
        """Owner -> the part of ``gpu`` it holds, times the GPU's model weight (empty when no
        job is resident)."""
        return self._split.get(gpu, {})

    # -- entitlements -------------------------------------------------------------------------
    def active(self, queued: Mapping[str, int]) -> dict[str, int]:
        """Owner -> its active jobs: resident plus ``queued`` (owners with none left out)."""
        jobs: dict[str, int] = {}
        for o, n in self.resident.items():
            if n > 0:
                jobs[o] = n
        for o, n in queued.items():
            if n > 0:
                jobs[o] = jobs.get(o, 0) + n
        return jobs

    def fair_cap(self, job: str | None = None) -> float:
        """The most of a GPU a fair slice of ``job`` may be now (None: averaged over jobs;
        :meth:`FairSlices.cap`)."""
        return self.slices.cap(job)

    def entitlements(self, queued: Mapping[str, int], demand_per_job: float | None = None,
                     ) -> dict[str, float]:
        """GPUs each owner with active jobs is entitled to (in the model-neutral unit,
        :meth:`capacity`): the cluster's GPUs shared max-min fair by weight over demands (an
        owner's demand: its resident jobs plus ``queued``,
        ``demand_per_job`` GPU each (default :meth:`fair_cap`), one GPU at least).
        Water-filling: owners whose demand is under their weighted part get their demand;
        the rest is shared again among the others. With accounts, an owner with queued jobs
        demands at least its holding plus their smallest slices (``fairfill.floored``)."""
        jobs = self.active(queued)
        d = self.fair_cap() if demand_per_job is None else demand_per_job
        cap = self.capacity()
        per_gpu = cap / len(self.state.gpus) if self.state.gpus else 1.0
        demand = {o: min(float(n), max(1.0, n * d)) * per_gpu for o, n in jobs.items()}
        if self.config.accounts:    # a waiting job is demand not met (fairfill.floored)
            demand = floored(demand, self.held, fairorder.queued_needs(self))
        return two_level_fill(cap, demand, self.config)

    def capacity(self) -> float:
        """The policies' GPUs in the model-neutral unit (:meth:`model_weight`: their count on
        a one-model cluster), what :meth:`entitlements` shares out and ``held`` counts in."""
        for gs in self.state.gpus.values():
            if gs.geom not in self._geoms:
                self._geoms[gs.geom] = None
                self._smallest = {}
        return sum(self.model_weight(gs.model) for gs in self.state.gpus.values())

    def plan_budget(self, sizes: Iterable[float]) -> None:
        """With a stated ``fairness_price``: the fair slice cap for this decision
        (:meth:`FairSlices.plan` on the backlog sampled now; ``sizes``: the profile sizes as
        parts of a GPU). Nothing without a price."""
        if self.config.fairness_price is None:
            return
        self._sample_backlog()
        self.slices.plan(list(sizes))

    def protected(self, owner: str, ents: Mapping[str, float]) -> bool:
        """Whether ``owner`` holds no more than its entitlement (``keep_margin`` included):
        its jobs keep their fair slices and no reclaim takes from it."""
        return self.held.get(owner, 0.0) <= ents.get(owner, 0.0) + self.config.keep_margin + 1e-6

    # -- fair share (miso.sched.fairorder) ----------------------------------------------------
    def level(self, owner: str, now: float) -> float:
        """``u / w`` of ``owner`` (:func:`miso.sched.fairorder.level`)."""
        return fairorder.level(self, owner, now)

    def levels(self, owner: str, now: float) -> tuple[float, float] | float:
        """The queue order's key for ``owner`` (:func:`miso.sched.fairorder.levels`)."""
        return fairorder.levels(self, owner, now)

    def factor(self, owner: str, now: float) -> float:
        """Slurm's fair-share factor of ``owner`` (:func:`miso.sched.fairorder.factor`)."""
        return fairorder.factor(self, owner, now)

    def order(self, queue: Iterable[str], extra_in_use: Mapping[str, float] | None = None,
              ) -> list[str]:
        """The queued jobs as the policy should take them (:func:`miso.sched.fairorder.order`:
        priority, fair share, FIFO; quotas hold jobs back)."""
        return fairorder.order(self, queue, extra_in_use)

    def smallest_charge(self, job: str) -> float:
        """The smallest GPU-equivalent share of a slice that holds the job on any GPU model
        the cluster has had (cached per memory size); 1.0 under a policy of whole GPUs."""
        if self.whole_gpus:
            return 1.0
        mem = self.state.jobs[job].spec.memory_gb
        got = self._smallest.get(mem)
        if got is None:
            got = 1.0
            for geom in self._geoms:
                full = geom.model.full_profile().compute_slices
                for p in geom.profiles:
                    if p.memory_gib + 1e-9 >= mem:
                        got = min(got, p.compute_slices / full)
            self._smallest[mem] = got
        return got

    def why_waiting(self, job: str) -> str | None:
        """Why a queued job is held back (over its owner's in-use quota), or None."""
        return self.waiting.get(job)

    # -- submissions -------------------------------------------------------------------------
    def refuse_submit(self, owner: str) -> str | None:
        """The one-line reason to refuse a new job of ``owner`` (queued quota), or None."""
        return fairorder.refuse_submit(self, owner)

    # -- reports ------------------------------------------------------------------------------
    def report(self, now: float) -> dict[str, dict[str, float | str]]:
        """Per owner: decayed usage, GPU-equivalents in use, weight, fair-share factor, and
        the share it receives against the one it is entitled to: ``held`` (GPUs it holds,
        each occupied GPU counted once, split by charges) and ``entitled`` (its entitlement
        now, :meth:`entitlements`: 0 without active jobs); with accounts, its ``account``."""
        owners = sorted(set(self.usage) | set(self.in_use))
        queued: dict[str, int] = {}
        st = self.state
        for j in st.queue:
            o = st.jobs[j].spec.owner
            queued[o] = queued.get(o, 0) + 1
        ents = self.entitlements(queued) if st.gpus else {}
        cfg = self.config
        out: dict[str, dict[str, float | str]] = {}
        for o in owners:
            row: dict[str, float | str] = {
                "usage_gpu_s": self.usage_at(o, now), "in_use": self.in_use.get(o, 0.0),
                "weight": cfg.weight(o), "fair_share": self.factor(o, now),
                "held": self.held.get(o, 0.0), "entitled": ents.get(o, 0.0)}
            if o in cfg.accounts:
                row["account"] = cfg.accounts[o]
            out[o] = row
        return out
