"""Baselines: NoPart (whole GPU per job), OptSta (one static layout), MPS-only (3 equal shares)."""

from __future__ import annotations

from collections.abc import Sequence

from miso.mig import Placement
from miso.sched.decisions import ApplyLayout, RunMps
from miso.sched.policies.base import BasePolicy, Scratch, fitting_profiles
from miso.sched.policy import register

#: How far down the queue a policy looks for a job that fits (backfilling), per event.
BACKFILL_WINDOW = 64


@register("nopart")
class NoPart(BasePolicy):
    """One job per whole GPU, FIFO. A new job takes the free GPU that was added first."""

    name = "nopart"

    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        free = [g for g in st.gpus if not sc.jobs_on(g)]
        if not free:
            return
        fi = 0
        for j in sc.queue()[:BACKFILL_WINDOW]:
            if fi >= len(free):
                break
            gs = st.gpus[free[fi]]
            full = gs.geom.model.full_profile()
            if full.memory_gib + 1e-9 < st.jobs[j].spec.memory_gb:
                continue
            pl = Placement(0, full.name)
            sc.place(j, gs.id)
            sc.out.append(ApplyLayout(gs.id, st.new_plan_id(), (pl,), {j: pl}))
            fi += 1


@register("optsta")
class OptSta(BasePolicy):
    """One static layout on every GPU; a job takes the largest free instance that fits.

    ``layout`` is a tuple of placements valid on every GPU of the cluster (the simulator's
    offline search picks the best maximal layout, see :func:`miso.sim.run.optsta_search`).
    When a job finishes, a job of the same GPU on a smaller instance moves up to the freed one
    (``promote``), as in the MISO artifact's static scheme.
    """

    name = "optsta"

    def __init__(self, layout: Sequence[Placement] | None = None, promote: bool = True,
                 **_: object) -> None:
        self.layout = tuple(sorted(layout)) if layout is not None else None
        self.promote = promote

    def _layout(self, sc: Scratch, gpu: str) -> tuple[Placement, ...]:
        if self.layout is not None:
            return self.layout
        full = sc.state.gpus[gpu].geom.model.full_profile()
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

    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        queue = sc.queue()[:BACKFILL_WINDOW]
        if not queue:
            return
        # (gpu index, gpu, free instances) of GPUs with a free instance; one pass per event.
        free: dict[str, list[Placement]] = {}
        order: dict[str, int] = {}
        for gi, g in enumerate(st.gpus):
            f = self._free(sc, g, self._asg(sc, g))
            if f:
                free[g] = f
                order[g] = gi
        if not free:
            return
        new_asg: dict[str, dict[str, Placement]] = {}
        for j in queue:
            if not free:
                break
            mem = st.jobs[j].spec.memory_gb
            best: tuple[tuple[int, int, int], str, Placement] | None = None
            for g, insts in free.items():
                gs = st.gpus[g]
                fits = fitting_profiles(gs.geom, mem)
                n = len(new_asg.get(g) or self._asg(sc, g))
                for pl in insts:
                    if pl.profile not in fits:
                        continue
                    key = (-gs.geom.model.profile(pl.profile).compute_slices, n, order[g])
                    if best is None or key < best[0]:
                        best = (key, g, pl)
            if best is None:
                continue
            _, g, pl = best
            sc.place(j, g)
            asg = dict(new_asg.get(g) or self._asg(sc, g))
            asg[j] = pl
            new_asg[g] = asg
            free[g].remove(pl)
            if not free[g]:
                del free[g]
        for g, asg in new_asg.items():
            sc.out.append(ApplyLayout(g, st.new_plan_id(), self._layout(sc, g), asg))

    def on_finish(self, now: float, job: str, gpu: str | None, sc: Scratch) -> None:
        before = len(sc.out)
        self.on_capacity(now, sc)
        if not self.promote or gpu is None or gpu not in sc.state.gpus:
            return
        if any(isinstance(d, ApplyLayout) and d.gpu == gpu for d in sc.out[before:]):
            return  # a queued job took the freed instance
        st = sc.state
        gs = st.gpus[gpu]
        if gs.busy:
            return
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


@register("mps")
class MpsOnly(BasePolicy):
    """Each GPU split into ``slots`` equal MPS shares (paper: 3); new job to the least crowded
    GPU whose memory still holds it. The co-location penalty is physics (simulator/hardware)."""

    name = "mps"

    def __init__(self, slots: int = 3, **_: object) -> None:
        self.slots = slots

    def on_capacity(self, now: float, sc: Scratch) -> None:
        st = sc.state
        share = 100 // self.slots
        touched: list[str] = []
        order = {g: i for i, g in enumerate(st.gpus)}
        for j in sc.queue()[:BACKFILL_WINDOW]:
            mem = st.jobs[j].spec.memory_gb
            best = None
            for g, gs in st.gpus.items():
                n = len(sc.jobs_on(g))
                if n >= self.slots:
                    continue
                cap = gs.geom.model.full_profile().memory_gib
                if sc.memory_on(g) + mem > cap + 1e-9:
                    continue
                key = (n, order[g])
                if best is None or key < best[0]:
                    best = (key, g)
            if best is None:
                continue
            g = best[1]
            sc.place(j, g)
            if g not in touched:
                touched.append(g)
        for g in touched:
            sc.out.append(RunMps(g, st.new_plan_id(), dict.fromkeys(sc.jobs_on(g), share)))
