"""Baselines: NoPart (whole GPU per job), OptSta (one static layout), MPS-only (3 equal shares)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from functools import cache

from miso.mig import Geometry, Placement
from miso.sched.decisions import ApplyLayout, RunMps
from miso.sched.occupancy import Occupancy
from miso.sched.policies.base import BasePolicy, Scratch, fitting_profiles

#: How far down the queue a policy looks for a job that fits (backfilling), per event.
BACKFILL_WINDOW = 64


def backfill_window(sc: Scratch) -> int:
    """How far down the queue this call looks: :data:`BACKFILL_WINDOW`, plus the other
    submissions of a batch delivered at one instant (their placement passes were left to the
    last one: :meth:`miso.sched.driver.DriverStep.arrivals`)."""
    return BACKFILL_WINDOW + sc.state.batch_arrivals - 1


class NoPart(BasePolicy):
    """One job per whole GPU, FIFO. A new job takes the free GPU that was added first."""

    name = "nopart"
    whole_gpus_only = True  # in-use quotas count a job as a whole GPU (issue 26)

    def __init__(self) -> None:
        self.occ: Occupancy[Scratch] = Occupancy(
            lambda sc, g: None if sc.jobs_on(g) else "free")

    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        cy = sc.cycle
        queue = sc.queue(backfill_window(sc))
        if not queue:
            return
        # Each job takes at most one GPU, so the first len(queue) free GPUs are enough
        # (all of them when filters may turn some down).
        free = self.occ.view(sc).members("free", len(st.gpus) if cy.filters else len(queue))
        fi = 0
        for j in queue:
            if fi >= len(free):
                break
            gs = st.gpus[free[fi]]
            if not self.capacity_fit(gs.id, (), j, sc):
                continue
            if cy.filters:  # the first free GPU the profile's filters allow
                k = next((k for k in range(fi, len(free)) if cy.allowed(j, free[k], ())),
                         None)
                if k is None:
                    continue
                free[fi], free[k] = free[k], free[fi]
                gs = st.gpus[free[fi]]
            pl = Placement(0, gs.geom.model.full_profile().name)
            sc.place(j, gs.id)
            sc.out.append(ApplyLayout(gs.id, st.new_plan_id(), (pl,), {j: pl}))
            fi += 1

    def capacity_fit(self, gpu: str, remaining: Sequence[str], job: str, sc: Scratch
                     ) -> bool:
        full = sc.state.gpus[gpu].geom.model.full_profile()
        return not remaining and full.memory_gib + 1e-9 >= sc.state.jobs[job].spec.memory_gb


class OptSta(BasePolicy):
    """One static layout on every GPU; a job takes the largest free instance that fits.

    ``layout`` is a tuple of placements valid on every GPU of the cluster (the simulator's
    offline search picks the best maximal layout, see :func:`miso.sim.run.optsta_search`), or
    on several GPU models a mapping model -> layout (one best static layout per model; a model
    it does not name runs whole GPUs).
    When a job finishes, a job of the same GPU on a smaller instance moves up to the freed one
    (``promote``), as in the MISO artifact's static scheme.
    """

    name = "optsta"

    def __init__(self, layout: Sequence[Placement] | Mapping[str, Sequence[Placement]]
                 | None = None, promote: bool = True) -> None:
        self.by_model: dict[str, tuple[Placement, ...]] = {}
        if isinstance(layout, Mapping):
            self.by_model = {m: tuple(sorted(lay)) for m, lay in layout.items()}
            layout = None
        self.layout = tuple(sorted(layout)) if layout is not None else None
        self.promote = promote
        # GPUs with a free instance, by (free instances, assigned jobs, geometry).
        self.occ: Occupancy[Scratch] = Occupancy(self._occ_key)
        self._call_asg: dict[str, dict[str, Placement]] = {}  # assignments made this call

    def _layout(self, sc: Scratch, gpu: str) -> tuple[Placement, ...]:
        if self.layout is not None:
            return self.layout
        gs = sc.state.gpus[gpu]
        if gs.model in self.by_model:
            return self.by_model[gs.model]
        full = gs.geom.model.full_profile()
        return (Placement(0, full.name),)

    def on_gpu_added(self, now: float, gpu: str, sc: Scratch) -> None:
        sc.out.append(ApplyLayout(gpu, sc.state.new_plan_id(), self._layout(sc, gpu), {}))
        self.on_capacity(now, sc)

    def _asg(self, sc: Scratch, gpu: str) -> dict[str, Placement]:
        gs = sc.state.gpus[gpu]
        return {j: pl for j, pl in gs.target_assignment().items() if j not in sc.requeued}

    def _free(self, sc: Scratch, gpu: str, asg: dict[str, Placement]) -> list[Placement]:
        used = set(asg.values())
        return [pl for pl in self._layout(sc, gpu) if pl not in used]

    def _occ_key(self, sc: Scratch, g: str) -> Hashable | None:
        asg = self._call_asg.get(g) or self._asg(sc, g)
        free = tuple(self._free(sc, g, asg))
        return (free, len(asg), sc.state.gpus[g].geom) if free else None

    def capacity_fit(self, gpu: str, remaining: Sequence[str], job: str, sc: Scratch
                     ) -> bool:
        geom = sc.state.gpus[gpu].geom
        asg = {j: pl for j, pl in self._asg(sc, gpu).items() if j in remaining}
        if len(asg) < len(remaining):
            return False  # a resident without an instance yet: no room to reason about
        fits = fitting_profiles(geom, sc.state.jobs[job].spec.memory_gb)
        return _largest_fitting(geom, tuple(self._free(sc, gpu, asg)), fits) is not None

    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        queue = sc.queue(backfill_window(sc))
        if not queue:
            return
        self._call_asg = new_asg = {}
        occ = self.occ.view(sc)
        fail = float("inf")  # smallest memory that found no instance this call
        for j in queue:
            mem = st.jobs[j].spec.memory_gb
            if not occ.any():
                break
            if mem >= fail:
                continue  # placements only take instances: a larger job fits no better
            # The largest fitting free instance; then the GPU with fewest jobs; then GPU order.
            best: tuple[tuple[int, int, int], str, Placement] | None = None
            for (free, n, geom), g in occ.classes():  # type: ignore[misc]
                got = _largest_fitting(geom, free, fitting_profiles(geom, mem))
                if got is None:
                    continue
                key = (-got[0], n, occ.rank(g))
                if best is None or key < best[0]:
                    best = (key, g, got[1])
            if best is None:
                fail = mem
                continue
            _, g, pl = best
            asg = dict(new_asg.get(g) or self._asg(sc, g))
            asg[j] = pl
            new_asg[g] = asg
            sc.place(j, g)
            occ = self.occ.view(sc)
        for g, asg in new_asg.items():
            sc.out.append(ApplyLayout(g, st.new_plan_id(), self._layout(sc, g), asg))
        self._call_asg = {}

    def on_finish(self, now: float, job: str, gpu: str | None, sc: Scratch) -> None:
        before = len(sc.out)
        self.on_capacity(now, sc)
        if not self.promote or gpu is None or gpu not in sc.state.gpus:
            return
        if any(isinstance(d, ApplyLayout) and d.gpu == gpu for d in sc.out[before:]):
            return  # a queued job took the freed instance
        if not sc.state.gpus[gpu].busy:
            self.promote_into_freed(gpu, sc)

    def promote_into_freed(self, gpu: str, sc: Scratch) -> None:
        """Move jobs of ``gpu`` on smaller instances up into its free larger ones (the
        smallest first, then by id), one plan for all the moves."""
        st = sc.state
        gs = st.gpus[gpu]
        comp = {p.name: p.compute_slices for p in gs.geom.profiles}
        asg = dict(gs.assignment)
        moved = False
        while True:
            free = sorted(self._free(sc, gpu, asg), key=lambda p: -comp[p.profile])
            if not free:
                break
            big = free[0]
            cands = [j for j, pl in asg.items() if comp[pl.profile] < comp[big.profile]
                     and big.profile in fitting_profiles(gs.geom, st.jobs[j].spec.memory_gb)]
            if not cands:
                break
            j = min(cands, key=lambda x: (comp[asg[x].profile], x))
            asg[j] = big
            moved = True
        if moved:
            sc.out.append(ApplyLayout(gpu, st.new_plan_id(), self._layout(sc, gpu), asg))


@cache
def _largest_fitting(geom: Geometry, free: tuple[Placement, ...], fits: tuple[str, ...]
                     ) -> tuple[int, Placement] | None:
    """(compute slices, instance) of the first free instance with the most compute slices among
    those whose profile is in ``fits``."""
    best: tuple[int, Placement] | None = None
    for pl in free:
        if pl.profile in fits:
            c = geom.model.profile(pl.profile).compute_slices
            if best is None or c > best[0]:
                best = (c, pl)
    return best


def _jobs_tag(cls: Hashable) -> tuple[Hashable]:
    return (cls[0],)  # type: ignore[index]


class MpsOnly(BasePolicy):
    """Each GPU split into ``slots`` equal MPS shares (paper: 3); new job to the least crowded
    GPU whose memory still holds it. The co-location penalty is physics (simulator/hardware)."""

    name = "mps"

    def __init__(self, slots: int = 3) -> None:
        self.slots = slots
        # GPUs with a free slot, by (resident jobs, memory they use, GPU memory); tag: jobs.
        self.occ: Occupancy[Scratch] = Occupancy(self._occ_key, _jobs_tag)

    def _occ_key(self, sc: Scratch, g: str) -> Hashable | None:
        n = len(sc.jobs_on(g))
        if n >= self.slots:
            return None
        return (n, sc.memory_on(g), sc.state.gpus[g].geom.model.full_profile().memory_gib)

    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        share = 100 // self.slots
        touched: list[str] = []
        fail = float("inf")  # smallest memory that found no GPU this call
        for j in sc.queue(backfill_window(sc)):
            mem = st.jobs[j].spec.memory_gb
            occ = self.occ.view(sc)
            if not occ.any():
                break  # every GPU is full
            if mem >= fail:
                continue  # placements only fill GPUs: a larger job fits no better
            g = None
            for n in range(self.slots):  # least crowded first, then GPU order
                g = occ.first((n,), lambda c, mem=mem: c[1] + mem <= c[2] + 1e-9)  # type: ignore
                if g is not None:
                    break
            if g is None:
                fail = mem
                continue
            sc.place(j, g)
            if g not in touched:
                touched.append(g)
        for g in touched:
            sc.out.append(RunMps(g, st.new_plan_id(), dict.fromkeys(sc.jobs_on(g), share)))

    def capacity_fit(self, gpu: str, remaining: Sequence[str], job: str, sc: Scratch
                     ) -> bool:
        st = sc.state
        mem = sum(st.jobs[j].spec.memory_gb for j in (*remaining, job))
        return len(remaining) < self.slots and \
            mem <= st.gpus[gpu].geom.model.full_profile().memory_gib + 1e-9
