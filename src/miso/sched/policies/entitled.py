"""Fair share's sizes as one decision call sees them: each owner's entitlement, the fair
slices a protected owner's jobs are owed, and whether a mix of jobs on a GPU keeps them (the
mechanism and its formulas: :mod:`miso.sched.tenancy`, "Entitlements"). Built per call by
:class:`~miso.sched.policies.base.Scratch` (``sc.fair``); pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from miso.sched.fairprice import fair_fraction, packed_share
from miso.sched.fairunused import first_slice, weighted_part, whole_owed

if TYPE_CHECKING:  # pragma: no cover
    from miso.mig import Geometry
    from miso.sched.policies.base import Scratch
    from miso.sched.policies.framework import FairSliceFloor

#: A fair slice of at most this many compute slices more than the owed part still counts
#: (the owed part is rounded to the nearest compute slice, not down).
ROUND = 1e-9
#: A protected owner's job that has run this long (s) since its last start keeps the slice
#: it runs on as its fair slice (:meth:`Entitled.kept`).
KEEP_AFTER_S = 20_000.0
#: The fair-slice plugins act while a job's packed share is above this many smallest slices.
QUEUE_MARGIN = 1.0

Sigs = tuple[tuple[str, ...], ...]


class Entitled:
    """Entitlements and fair slices for one ``decide`` call (cached: the ledger does not change
    during a call)."""

    def __init__(self, sc: Scratch, feasible: Callable[[Geometry, Sigs], bool],
                 fits: Callable[[Geometry, float], tuple[str, ...]]) -> None:
        self.sc = sc
        self.feasible = feasible          # a layout holds jobs with these profile choices
        self.fits = fits                  # profiles with enough memory for a job
        self._ents: dict[str, float] | None = None
        self._active: dict[str, int] = {}
        self._floors: dict[tuple[Geometry, str, float, float, float, float,
                                 tuple[float, str | None] | None],
                           frozenset[str] | None] = {}
        self._parts: dict[str, float] = {}   # owner -> its weighted part (GPUs), this call
        self._raisers: tuple[FairSliceFloor, ...] | None = None   # this call's (:meth:`raisers`)

    def entitlements(self) -> dict[str, float]:
        """GPUs each owner with active jobs is entitled to, as the call began."""
        if self._ents is None:
            st = self.sc.state
            ten = st.tenancy
            assert ten is not None
            queued: dict[str, int] = {}
            for j in st.queue:
                o = st.jobs[j].spec.owner
                queued[o] = queued.get(o, 0) + 1
            if ten.config.fairness_price is not None and st.gpus:
                geom = next(iter(st.gpus.values())).geom
                full = geom.model.full_profile().compute_slices
                ten.plan_budget({p.compute_slices / full for p in geom.profiles})
            self._ents = ten.entitlements(queued)
            self._active = {o: queued.get(o, 0) + ten.resident.get(o, 0) for o in self._ents}
        return self._ents

    def fair_slices(self, geom: Geometry, owner: str, job: str | None = None,
                    ) -> frozenset[str] | None:
        """The profiles of ``geom`` a job (``job``) of ``owner`` is owed while the owner is
        protected: its fair slice, the largest profile of at most ``min(cap, entitlement /
        active jobs)`` of a GPU (``cap``: :meth:`~miso.sched.tenancy.Tenancy.fair_cap`; when
        the jobs' caps differ, a stated price's ``share``, each job's own cap scaled by the
        entitlement per job over the mean cap), or larger; None: any profile (not protected,
        or the fair slice is the smallest profile). A job a reclaim returned room for is owed
        that room's fair slice at least until it runs on a slice (its ``promised`` slice: the
        entitlement per job may shrink before the victims' slices free)."""
        ten = self.sc.state.tenancy
        assert ten is not None
        ents = self.entitlements()          # plans this call's budget first
        own, mean = ten.fair_cap(job), ten.fair_cap()
        promised = ten.slices.promised.get(job, 0.0) if job is not None else 0.0
        kept = self.kept(job) if job is not None else 0.0
        first = self._first_of(geom, owner, job)
        raise_for = self._floor_job(job)
        key = (geom, owner, own, promised, kept, first, raise_for)
        if key in self._floors:
            return self._floors[key]
        frac = promised
        if owner in ents and ten.protected(owner, ents):
            per_job = ents[owner] / max(1, self._active.get(owner, 1))
            frac = max(frac, fair_fraction(own, mean, per_job), kept, first)
        got = owed_profiles(geom, frac)
        if got is not None and raise_for is not None:
            for plugin in self.raisers():
                got = plugin.owed(geom, got, *raise_for)
        self._floors[key] = got
        return got

    def _floor_job(self, job: str | None) -> tuple[float, str | None] | None:
        """``job``'s (memory, workload) when fair-slice plugins may raise its fair slice
        (:meth:`raisers`, this call) and it runs; else None.

        Only a running job: its raised slice is what the next re-plan grows it to in place,
        never a size a queued job must wait for. Owed at placement too, the three raises of
        Philly by vc at 5 %, seed 2 (queued jobs of small vcs made to wait for whole GPUs)
        moved its price +1.51 -> +4.06 % (target 3 %); running only, +1.22 %, and the two
        owners 80/20 at 1.6x the cluster keep the gain (seeds 1-3: light owner 1.285 / 1.253
        / 1.297 at +3.98 / +0.48 / +3.71 %; benchmarks/history/2026-12-03-h13-fair.md)."""
        if job is None or not self.raisers():
            return None
        st = self.sc.state
        if st.jobs[job].status.value != "running":
            return None
        spec = st.jobs[job].spec
        return spec.memory_gb, spec.workload

    def raisers(self) -> tuple[FairSliceFloor, ...]:
        """The fair-slice plugins that raise a running job's fair slice in this call: those of
        the cycle's entitlement filter (its ``floors``;
        :class:`~miso.sched.policies.framework.Entitlement`, :mod:`miso.sched.fairspeed`),
        with a stated price and packing pressure, not a queue (:meth:`_no_queue`); none
        otherwise. Constants of one call (its budget is planned once, by
        :meth:`entitlements`), so worked out once, not per fair slice asked."""
        if self._raisers is None:
            self.entitlements()             # plans this call's budget
            ten = self.sc.state.tenancy
            assert ten is not None
            plugins = tuple(p for f in self.sc.cycle.filters for p in getattr(f, "floors", ()))
            acts = bool(plugins) and ten.config.fairness_price is not None and self._no_queue()
            self._raisers = plugins if acts else ()
        return self._raisers

    def _no_queue(self) -> bool:
        """With a stated price, the backlog is packing pressure, not a queue (the packed
        share is above the smallest slice the budget was planned with:
        :func:`~miso.sched.fairprice.fair_cap`): only then do the fair-slice plugins raise a
        job's fair slice."""
        ten = self.sc.state.tenancy
        assert ten is not None
        b = ten.slices.budget
        if b is None or not self.sc.state.gpus:
            return False
        return packed_share(b.pressure) > b.smallest * QUEUE_MARGIN + 1e-12

    def _first_of(self, geom: Geometry, owner: str, job: str | None) -> float:
        """:meth:`first` for ``job`` (0 for none); a whole GPU when it runs on one, runs long
        (:meth:`runs_long`) and :meth:`grown` owes it: a grown job, restarted by its growth,
        is not shrunk back before it has run :data:`KEEP_AFTER_S` again. (Any job on a
        whole GPU so owed kept it: the two owners 80/20 at 3.25x the cluster, seed 1, light
        owner 1.557 -> 1.629.)"""
        if job is None:
            return 0.0
        first = self.first(geom, owner)
        if self.on_slice(job) < 1.0 - ROUND or not self.runs_long(job):
            return first
        return max(first, self.grown(owner))

    def runs_long(self, job: str) -> bool:
        """``job`` has run :data:`KEEP_AFTER_S` since its last start or has at least that
        much work left (its last progress report)."""
        st = self.sc.state
        ten = st.tenancy
        assert ten is not None
        since = ten.running_since.get(job)
        left = st.jobs[job].remaining_work(st.now)
        return ((since is not None and st.now - since >= KEEP_AFTER_S)
                or (left is not None and left >= KEEP_AFTER_S))

    def first(self, geom: Geometry, owner: str) -> float:
        """With a stated price, when ``owner`` has one active job (queued or running), that
        job's fair slice: what it would get alone on its owner's weighted part of the
        cluster, up to the largest slice below a whole GPU (:mod:`miso.sched.fairunused`);
        else 0."""
        ten = self.sc.state.tenancy
        assert ten is not None
        if ten.config.fairness_price is None:
            return 0.0
        self.entitlements()                  # the active jobs per owner, as the call began
        if self._active.get(owner, 0) != 1:
            return 0.0
        if owner not in self._parts:
            weight = {o: ten.config.weight(o) for o in self._active}
            self._parts[owner] = weighted_part(owner, self._active, weight, ten.capacity())
        full = geom.model.full_profile().compute_slices
        return first_slice(self._parts[owner], 1, [p.compute_slices / full
                                                   for p in geom.profiles])

    def grown(self, owner: str) -> float:
        """With a stated price, a whole GPU (1.0) when each of ``owner``'s active jobs would
        have one alone on its owner's weighted part of the cluster (:func:`~miso.sched.
        fairunused.whole_owed`); else 0. Grown only for a job :meth:`kept` holds (a job that
        has run that long runs long: growing it in place pays one restart for the rest of
        its run; :func:`~miso.sched.policies.reclaim.reclaim`), and kept as the fair slice
        of a job already on a whole GPU. Not owed to a job that shares its GPU: a layout
        that cannot give it a whole GPU beside the others then drops its fair slice, and it
        was shrunk (measured, Philly at 5 %, seed 2: vc e13805's 4g job to 2g, 1.55)."""
        ten = self.sc.state.tenancy
        assert ten is not None
        if ten.config.fairness_price is None:
            return 0.0
        return whole_owed(self.part(owner), self._active.get(owner, 0))

    def part(self, owner: str) -> float:
        """``owner``'s weighted part of the cluster among the owners with active jobs, as
        the call began (:func:`~miso.sched.fairunused.weighted_part`)."""
        ten = self.sc.state.tenancy
        assert ten is not None
        self.entitlements()
        if owner not in self._parts:
            weight = {o: ten.config.weight(o) for o in self._active}
            self._parts[owner] = weighted_part(owner, self._active, weight, ten.capacity())
        return self._parts[owner]

    def kept(self, job: str) -> float:
        """The slice ``job`` runs on, as a part of a GPU, when it has run
        :data:`KEEP_AFTER_S` since its last start (0 otherwise): its owner, while protected,
        keeps it as the job's fair slice. The stated price's cap falls with the backlog for
        the slices fair share gives next; a job that has run that long is likely to run
        much longer (job lengths are heavy-tailed), and shrinking it restarts it and slows
        all of that. Measured, Philly by vc at 5 %: vc e13805's two jobs of 0.8-0.9 M s
        were moved from 4g to 3g and 2g slices when the largest vc's flood raised the
        backlog and ran 2.4-2.9x as long as alone; kept, 1.5x, with fewer restarts in all
        (441 -> 363, seed 1). The two owners 80/20's jobs (3,122 s on average) hardly ever
        run that long: their decisions did not move (seed 1, three loads); keeping every
        running job's slice did move them (the light owner at 1.6x the cluster 1.294 ->
        1.320, +1.7 points of price)."""
        st = self.sc.state
        ten = st.tenancy
        assert ten is not None
        since = ten.running_since.get(job)
        if since is None or st.now - since < KEEP_AFTER_S:
            return 0.0
        return self.on_slice(job)

    def on_slice(self, job: str) -> float:
        """The slice ``job`` runs on, as a part of its own GPU (0: on none)."""
        st = self.sc.state
        js = st.jobs[job]
        gs = st.gpus.get(js.gpu) if js.gpu is not None else None
        if gs is None or job not in gs.assignment:
            return 0.0
        model = gs.geom.model        # its own GPU's (the caller's geom may be another's)
        return (model.profile(gs.assignment[job].profile).compute_slices
                / model.full_profile().compute_slices)

    def _sig(self, geom: Geometry, job: str) -> tuple[str, ...]:
        spec = self.sc.state.jobs[job].spec
        fits = self.fits(geom, spec.memory_gb)
        owed = self.fair_slices(geom, spec.owner, job)
        return fits if owed is None else tuple(p for p in fits if p in owed)

    def mix(self, gpu: str, jobs: list[str]) -> bool:
        """Whether a layout of ``gpu`` holds ``jobs`` giving each job of a protected owner its
        fair slice."""
        geom = self.sc.state.gpus[gpu].geom
        return self.feasible(geom, tuple(self._sig(geom, j) for j in jobs))

    def may_join(self, job: str, gpu: str) -> bool:
        """Whether ``job`` may join the jobs on ``gpu``: only where every protected job there
        (and ``job``, if its owner is protected) keeps its fair slice; a GPU reclaimed in this
        call takes only jobs of the owner it was returned to."""
        sc = self.sc
        owner = sc.state.jobs[job].spec.owner
        if sc.reserved.get(gpu, owner) != owner:
            return False
        return self.mix(gpu, [*sc.jobs_on(gpu), job])

    def _owed_speeds(self, geom: Geometry, j: str, sp: dict[str, float]
                     ) -> dict[str, float] | None:
        """``sp`` cut to the fair slices ``j``'s owner is owed, when that cuts anything (not
        a running job that cannot checkpoint: it keeps its slice); else None."""
        jobs = self.sc.state.jobs
        if j not in jobs or (not jobs[j].spec.checkpointable
                             and jobs[j].status.value == "running"):
            return None
        owed = self.fair_slices(geom, jobs[j].spec.owner, j)
        if owed is None:
            return None
        kept = {p: v for p, v in sp.items() if p in owed}
        return kept if kept and len(kept) < len(sp) else None

    def speeds(self, gpu: str, speeds: dict[str, dict[str, float]]
               ) -> dict[str, dict[str, float]]:
        """``speeds`` as the optimizer should see them: a protected owner's job is offered
        only its fair slice or larger (not a running job that cannot checkpoint: it keeps its
        slice), for as many such jobs of the mix as a layout can hold so (all when it can;
        else one by one, the job already on the largest slice first: dropping every job's
        fair slice when one too many shared the GPU left the light owner's jobs on 1g slices
        although owed 2g, about a quarter of its jobs at 3.25x the cluster); else unchanged."""
        st = self.sc.state
        geom = st.gpus[gpu].geom
        cuts: dict[str, dict[str, float]] = {}
        for j, sp in speeds.items():
            kept = self._owed_speeds(geom, j, sp)
            if kept is not None:
                cuts[j] = kept
        if not cuts:
            return speeds
        out = {**speeds, **cuts}
        if self._holds(geom, out):
            return out
        gs = st.gpus[gpu]
        full = geom.model.full_profile().compute_slices

        def now_on(j: str) -> float:
            pl = gs.assignment.get(j)
            return geom.model.profile(pl.profile).compute_slices / full if pl else 0.0

        out = dict(speeds)
        for j in sorted(cuts, key=lambda j: (-now_on(j), j)):
            trial = {**out, j: cuts[j]}
            if self._holds(geom, trial):
                out = trial
        return out

    def _holds(self, geom: Geometry, speeds: dict[str, dict[str, float]]) -> bool:
        """Whether a layout gives every job of ``speeds`` one of its offered profiles."""
        jobs = self.sc.state.jobs
        return self.feasible(geom, tuple(
            tuple(p for p in self.fits(geom, jobs[j].spec.memory_gb) if p in speeds[j])
            for j in speeds if j in jobs))


def owed_profiles(geom: Geometry, frac: float) -> frozenset[str] | None:
    """The profiles of ``geom`` at least as large as the largest size within ``frac`` of a
    GPU; None where that is the smallest size (any profile will do)."""
    if frac <= 0:
        return None
    full = geom.model.full_profile().compute_slices
    sizes = sorted({p.compute_slices for p in geom.profiles})
    floor = max((c for c in sizes if c <= frac * full + ROUND), default=sizes[0])
    if floor <= sizes[0]:
        return None
    return frozenset(p.name for p in geom.profiles if p.compute_slices >= floor)
