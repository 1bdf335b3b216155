"""miso+'s moves on a cluster of several GPU models: which job a GPU that becomes idle takes.

On one GPU model a GPU that becomes idle can only help a job that shares a GPU (a whole GPU
beats its slice): :mod:`miso.sched.policies.rebalance` moves the job that saves most. On
several models it can also help a job that runs *alone* on a slower model, and a shared slice
of a fast model can beat a whole slow GPU. Blind to the model, a long job whose workload
gains 2.3x on an H100 stays on the A100 it landed on while an H100 idles (and the A100's
short jobs never free the H100 for it). Here every running job is a candidate for an idle
GPU: the one whose remaining time shrinks most, net of one restart, moves (Gavel's idea,
OSDI'20: the fast GPUs go to the jobs that gain most on them; here measured by time saved,
so a long job that gains 2x beats a short one that gains 2.6x).

Time on a GPU of model ``M``: remaining work (seconds alone on a whole GPU of the cluster's
first model) over the job's speed there, ``slice speed x f(w, M) / f(w, first)``, ``f`` being
:func:`miso.sched.modelspeed.model_factor` (a rule over datasheet figures; live, a job without
a catalogue workload has factor 1 everywhere: blind for it). Pure: reads the policy's view.
"""

from __future__ import annotations

import weakref
from typing import Any

from miso.mig import Geometry, Placement
from miso.sched.decisions import ApplyLayout, RequeueCause
from miso.sched.modelspeed import model_factor
from miso.sched.policies.base import Scratch
from miso.workloads import catalogue


def relative_speed(workload: str | None, model: str, first: str) -> float:
    """How fast ``workload`` runs on a whole ``model`` GPU in units of a whole ``first``
    (1.0 for an unknown workload: nothing tells the models apart for it)."""
    if workload is None or workload not in catalogue() or model == first:
        return 1.0
    return model_factor(workload, model) / model_factor(workload, first)


#: (the state, its GPU count, first and last GPU) -> the answer of :func:`several_models`
_seen: tuple[weakref.ref, tuple[int, str, str], bool] | None = None


def several_models(sc: Scratch) -> bool:
    """Whether the cluster holds more than one GPU model. Asked per placement, so a
    one-model cluster of thousands of GPUs is scanned once per change of its GPU set (as far
    as its count and first and last GPU tell), not per call."""
    global _seen
    gpus = sc.state.gpus
    if not gpus:
        return False
    key = (len(gpus), next(iter(gpus)), next(reversed(gpus)))
    if _seen is not None and _seen[0]() is sc.state and _seen[1] == key:
        return _seen[2]
    models: set[str] = set()
    for gs in gpus.values():
        models.add(gs.geom.model.name)
        if len(models) > 1:
            break
    _seen = (weakref.ref(sc.state), key, len(models) > 1)
    return _seen[2]


#: A move (or swap) must save this many restarts beyond the restarts it costs (the blind
#: rebalance's rule; 0.5-4 measured within 1 % of each other on the two-model benchmark)
MARGIN = 1.0
#: Idle GPUs filled per decision (each scans every running job: bounded on a big cluster)
MAX_TARGETS = 16


class _View:
    """What a move is priced with, read from the policy (its work learner's ``remaining``,
    ``speeds``, its restart costs and ``pinned``), per decision."""

    def __init__(self, policy: Any, sc: Scratch) -> None:
        self.p, self.sc = policy, sc
        st = sc.state
        self.first = next(iter(st.gpus.values())).geom.model.name
        self._pinned: dict[str, set[str]] = {}

    def pinned(self, g: str) -> set[str]:
        if g not in self._pinned:
            self._pinned[g] = self.p.pinned(self.sc, self.sc.jobs_on(g))
        return self._pinned[g]

    def movable(self, g: str) -> list[str]:
        """Jobs of ``g`` that may move (running, checkpointable, not pinned, one GPU)."""
        gs = self.sc.state.gpus[g]
        jobs = self.sc.state.jobs
        held = self.pinned(g)
        return [j for j in self.sc.jobs_on(g) if j not in held and j in gs.assignment
                and jobs[j].spec.checkpointable and jobs[j].spec.num_gpus == 1]

    def allowed(self, j: str, dst: str) -> bool:
        """Whether the policy's filters (fair share's entitlements) let ``j`` onto ``dst``."""
        cy = self.sc.cycle
        return not cy.filters or cy.allowed(j, dst, ())

    def speed_now(self, j: str, g: str) -> float:
        """``j``'s speed on its slice of ``g``, in whole GPUs of the first model."""
        gs = self.sc.state.gpus[g]
        s = self.p.speeds(gs.geom, self.sc, [j])[j].get(gs.assignment[j].profile, 1.0)
        return max(s, 0.05) * self.speed_alone(j, gs.geom.model.name)

    def speed_alone(self, j: str, model: str) -> float:
        return relative_speed(self.sc.state.jobs[j].spec.workload, model, self.first)

    def time_saved(self, j: str, g: str, model: str) -> float:
        """Seconds ``j`` ends sooner alone on a whole ``model`` than where it runs (negative:
        later), one restart included."""
        left = self.p.work.remaining(self.sc.state, j)
        return left / self.speed_now(j, g) - left / self.speed_alone(j, model) \
            - self.p.restarts.cost(j)


def _best_onto(v: _View, dst: str, avoid: set[str]) -> tuple[float, str, str] | None:
    """(saved, job, its GPU) of the job that gains most alone on the whole GPU ``dst``."""
    best: tuple[float, str, str] | None = None
    st = v.sc.state
    model = st.gpus[dst].geom.model.name
    for g, gs in st.gpus.items():
        if g in avoid or gs.busy:
            continue
        jobs = v.sc.jobs_on(g)
        if not jobs or (len(jobs) < 2 and gs.geom.model.name == model):
            continue
        for j in v.movable(g):
            if not v.allowed(j, dst):
                continue
            got = (v.time_saved(j, g, model), j, g)
            if best is None or got > best:
                best = got
    return best


def _cheapest_lone(v: _View, model: str, target: str, avoid: set[str]
                   ) -> tuple[float, str, str] | None:
    """(saved, job, its GPU) of the job alone on a ``model`` GPU that loses least (saved is
    then negative) moving to the whole GPU ``target``."""
    best: tuple[float, str, str] | None = None
    target_model = v.sc.state.gpus[target].geom.model.name
    for g, gs in v.sc.state.gpus.items():
        if g in avoid or gs.busy or gs.geom.model.name != model:
            continue
        jobs = v.movable(g)
        if len(jobs) != 1 or len(v.sc.jobs_on(g)) != 1 or not v.allowed(jobs[0], target):
            continue
        got = (v.time_saved(jobs[0], g, target_model), jobs[0], g)
        if best is None or got > best:
            best = got
    return best


def plan_moves(policy: Any, sc: Scratch, target: str, used: set[str]
               ) -> list[tuple[float, str, str, str]]:
    """The moves that fill ``target`` (idle): ``(saved, job, source, destination)`` each.
    Either the job that gains most moves there (when it saves more than a restart beyond its
    own), or a swap: the job alone on another model that loses least moves there and the job
    that gains most on that model takes its GPU (when the pair saves more than two restarts
    beyond their own). ``used``: GPUs already a source or destination in this decision."""
    v = _View(policy, sc)
    st = sc.state
    tmodel = st.gpus[target].geom.model.name
    avoid = used | {target}
    one = _best_onto(v, target, avoid)
    best: list[tuple[float, str, str, str]] = []
    gain = 0.0
    if one is not None and one[0] > MARGIN * policy.restarts.cost(one[1]):
        gain = one[0] - MARGIN * policy.restarts.cost(one[1])
        best = [(one[0], one[1], one[2], target)]
    for model in {gs.geom.model.name for gs in st.gpus.values()} - {tmodel}:
        k = _cheapest_lone(v, model, target, avoid)
        if k is None:
            continue
        j = _best_onto(v, k[2], avoid | {k[2]})
        if j is None:
            continue
        net = k[0] + j[0] - MARGIN * (policy.restarts.cost(k[1]) + policy.restarts.cost(j[1]))
        if net > gain:
            best, gain = [(k[0], k[1], k[2], target), (j[0], j[1], j[2], k[2])], net
    for _, _, src, dst in best:
        used.update((src, dst))
    return best



def move_alone(sc: Scratch, job: str, dst: str, reason: str, gain: float, note: str) -> None:
    """Move running ``job`` onto the whole GPU ``dst`` (a rebalance: requeued for ``reason``,
    placed, ``dst`` given one whole-GPU instance; ``gain``: the seconds it is expected to
    save, ``note``: the plan's explanation)."""
    st = sc.state
    sc.requeue(job, reason, cause=RequeueCause.REBALANCE)
    sc.place(job, dst)
    full = Placement(0, st.gpus[dst].geom.model.full_profile().name)
    sc.out.append(ApplyLayout(dst, st.new_plan_id(), (full,), {job: full}, why={
        "trigger": "rebalance", "restarts": [job], "expected_gain": gain, "note": note}))


def fill_by_model(policy: Any, now: float, sc: Scratch) -> None:
    """miso+'s hook on several GPU models (:meth:`Rebalancing.fill_idle_gpus`, when nothing
    queues): each idle GPU (the first ``MAX_TARGETS``, in GPU order) gets the moves of
    :func:`plan_moves`; each source
    GPU left behind is re-planned. Decisions as the blind rebalance makes them (a requeue,
    a placement and the whole GPU's layout per move)."""
    st = sc.state
    used: set[str] = set()
    idle = [g for g, gs in st.gpus.items() if not gs.busy and not sc.jobs_on(g)]
    for target in idle[:MAX_TARGETS]:
        if target in used:
            continue
        moves = plan_moves(policy, sc, target, used)
        for saved, j, src, dst in moves:
            move_alone(sc, j, dst, f"rebalance to {dst} ({st.gpus[dst].geom.model.name})",
                       saved, f"{dst} ({st.gpus[dst].geom.model.name}) is free and nothing "
                       f"queues: {j} moves from {src} ({st.gpus[src].geom.model.name}) to the "
                       f"whole GPU, finishing ~{saved:.0f} s sooner net of one restart")
        dsts = {d for *_, d in moves}
        for _, _, src, _ in moves:
            if src not in dsts:
                policy.replan(now, src, sc)


def swap_on_arrival(policy: Any, sc: Scratch, job: str, g: str, held: str | None) -> str:
    """miso+'s hook on several GPU models (:meth:`GpuChoice.choose_gpu`): the GPU ``job``
    (queued, about to be placed on ``g``) goes to. When ``g`` is idle and a job running alone
    on another model loses less moving to ``g`` than ``job`` gains taking its GPU (net of
    the mover's restart, by more than one restart), that job moves to ``g`` (decided here)
    and its GPU is returned; else ``g``."""
    st = sc.state
    if sc.jobs_on(g) or st.gpus[g].busy:
        return g
    v = _View(policy, sc)
    left = policy.work.remaining(st, job)
    here = v.speed_alone(job, st.gpus[g].geom.model.name)
    best: tuple[float, str, str] | None = None
    for model in {gs.geom.model.name for gs in st.gpus.values()}:
        there = v.speed_alone(job, model)
        if there <= here:
            continue
        k = _cheapest_lone(v, model, g, {g, held or g})
        if k is None or not v.allowed(job, k[2]):
            continue
        net = left / here - left / there + k[0]
        if net > MARGIN * policy.restarts.cost(k[1]) and (best is None or net > best[0]):
            best = (net, k[1], k[2])
    if best is None:
        return g
    net, k, src = best
    move_alone(sc, k, g, f"makes room on {src} for {job}, which gains more there", net,
               f"{job} gains more on {src} ({st.gpus[src].geom.model.name}) than {k} loses "
               f"on {g} ({st.gpus[g].geom.model.name}): they swap, ~{net:.0f} s saved net of "
               "one restart")
    return src


def for_geometry(speeds: dict[str, float], geom: Geometry) -> dict[str, float]:
    """A job's estimated speeds (per profile, relative to the whole GPU) on ``geom``: the same
    dict when it names ``geom``'s whole-GPU profile; else, for a job that moved from another
    GPU model, each of ``geom``'s profiles takes the estimate of the profile with the same
    compute slices (speeds relative to the whole GPU are the model's compute share: MIG
    isolates; :mod:`miso.sched.speeds`), or the compute share itself where none matches."""
    full = geom.model.full_profile()
    if full.name in speeds or not speeds:
        return speeds
    by_slices: dict[int, float] = {}
    for name, s in speeds.items():
        g = compute_slices(name)
        if g is not None:
            by_slices.setdefault(g, s)
    return {p.name: by_slices.get(p.compute_slices, p.compute_slices / full.compute_slices)
            for p in geom.profiles}


def compute_slices(name: str) -> int | None:
    """Compute slices of the MIG profile ``name`` (``4g.40gb`` -> 4), None if not a MIG name."""
    head = name.split(".", 1)[0]
    if head.endswith("g") and head[:-1].isdigit():
        return int(head[:-1])
    return None
