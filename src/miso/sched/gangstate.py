"""The core's bookkeeping of whole-GPU runs (gangs): held GPUs and the gang queue.

:class:`~miso.sched.state.ClusterState` keeps one :class:`GangBook` (``state.gangs``). A GPU the
gang layer (:mod:`miso.sched.gangs`) holds leaves ``state.gpus`` (the policies' view) for
``book.gpus``: no policy places a job on it, its resident jobs run to their end (draining), and
whole-GPU runs start on it. A whole-GPU run (a gang of ``num_gpus`` GPUs, or a one-GPU job
backfilled onto a reserved GPU) is resident on each of its GPUs with the full-size instance
(so tenancy charges it one GPU-equivalent per GPU); ``JobState.gpu`` is its rank-0 GPU.

Gang jobs (``spec.num_gpus > 1``) wait in ``book.queue`` (FIFO), never in ``state.queue``: the
policies never see them. Everything here is all-or-nothing: a :class:`StartGang` is refused
(``ContractError``) unless every GPU it names is held, idle and its plan id new; a lost GPU
ends the whole run (every rank back to the queue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from miso.jobstatus import JobStatus
from miso.mig import Placement
from miso.sched.decisions import HoldGpu, ReleaseGpu, StartGang, StopGang
from miso.sched.events import GangFailed, GangStarted

if TYPE_CHECKING:
    from miso.sched.state import ClusterState, GpuState, JobState


class GangBook:
    """Held GPUs, queued gangs and the GPUs of every whole-GPU run."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.gpus: dict[str, GpuState] = {}     # held GPUs (out of the policies' view)
        self.queue: list[str] = []              # queued gang jobs, FIFO
        self.runs: dict[str, tuple[str, ...]] = {}  # job -> its GPUs (rank order)
        self.holding_for: dict[str, str] = {}   # held GPU -> the job it was held for

    # -- queries ------------------------------------------------------------------------------
    def run_on(self, gpu: str) -> str | None:
        """The whole-GPU run on held ``gpu``, or None."""
        gs = self.gpus.get(gpu)
        if gs is None:
            return None
        for j in gs.jobs:
            if j in self.runs:
                return j
        return None

    def idle(self, gpu: str) -> bool:
        """Held ``gpu`` holds no job and no plan is in flight on it."""
        gs = self.gpus[gpu]
        return not gs.jobs and gs.pending is None

    def waiting(self) -> bool:
        """Some gang job is queued."""
        return bool(self.queue)

    # -- events -------------------------------------------------------------------------------
    def submitted(self, js: JobState) -> None:
        self.queue.append(js.id)

    def ended(self, js: JobState) -> bool:
        """A job finished or failed; True when it was a whole-GPU run or a queued gang (then
        this book did all the bookkeeping)."""
        j = js.id
        if j in self.runs:
            self._take_off(j)
            return True
        if j in self.queue:
            self.queue.remove(j)
            return True
        return False

    def lost(self, gpu: str) -> None:
        """Held ``gpu`` left the cluster: the run on it goes back to the queue whole; its
        draining jobs too."""
        j = self.run_on(gpu)
        if j is not None:
            self._stop(j)
        gs = self.gpus.pop(gpu)
        self.holding_for.pop(gpu, None)
        for r in list(gs.jobs):
            self.state.requeue_resident(r)
        self.state.notify(gpu)

    def observe(self, now: float, ev: GangStarted | GangFailed) -> None:
        j = ev.job
        if j not in self.runs:
            return
        gpus = self.runs[j]
        if any(self.gpus[g].pending_plan_id != ev.plan_id for g in gpus if g in self.gpus):
            return  # stale
        if isinstance(ev, GangStarted):
            for g in gpus:
                gs = self.gpus[g]
                gs.applied_plan_id = ev.plan_id
                gs.pending = None
                self.state.notify(g)
            js = self.state.jobs[j]
            js.status = JobStatus.RUNNING
            js.placement = self.gpus[gpus[0]].layout[0]
        else:
            for g in gpus:
                gs = self.gpus[g]
                gs.applied_plan_id = ev.plan_id
                gs.pending = None
            self._stop(j, count_restart=False)

    # -- decisions ----------------------------------------------------------------------------
    def apply(self, d: HoldGpu | ReleaseGpu | StartGang | StopGang) -> None:
        from miso.sched.state import ContractError

        match d:
            case HoldGpu(gpu=g, job=j):
                self._hold(g, j)
            case ReleaseGpu(gpu=g):
                self._release(g)
            case StartGang():
                self._check_start(d)
                self._start(d)
            case StopGang(job=j):
                if j not in self.runs:
                    raise ContractError(f"StopGang {j}: not a whole-GPU run")
                self._stop(j)

    def _hold(self, g: str, j: str) -> None:
        from miso.sched.state import ContractError

        st = self.state
        gs = st.gpus.get(g)
        if gs is None:
            raise ContractError(f"HoldGpu {g}: not a GPU in the policies' view")
        if gs.pending is not None:
            raise ContractError(f"HoldGpu {g}: a plan is in flight")
        self.gpus[g] = st.gpus.pop(g)
        self.holding_for[g] = j
        st.notify(g)

    def _release(self, g: str) -> None:
        from miso.sched.state import ContractError

        if g not in self.gpus:
            raise ContractError(f"ReleaseGpu {g}: not held")
        if self.run_on(g) is not None:
            raise ContractError(f"ReleaseGpu {g}: a whole-GPU run holds it")
        self.state.gpus[g] = self.gpus.pop(g)
        self.holding_for.pop(g, None)
        self.state.notify(g)

    def _check_start(self, d: StartGang) -> None:
        """ContractError unless ``d`` starts a queued job on as many distinct, held, idle
        GPUs as it asks for, each with a new plan id and memory enough."""
        from miso.sched.state import ContractError

        j, gpus = d.job, d.gpus
        js = self.state.jobs.get(j)
        if js is None:
            raise ContractError(f"StartGang {j}: unknown job")
        if js.status is not JobStatus.QUEUED:
            raise ContractError(f"StartGang {j}: job is {js.status}, not queued")
        if len(gpus) != js.spec.num_gpus or len(set(gpus)) != len(gpus):
            raise ContractError(f"StartGang {j}: {len(set(gpus))} distinct GPUs for a "
                                f"job of {js.spec.num_gpus}")
        for g in gpus:
            if g not in self.gpus:
                raise ContractError(f"StartGang {j}: GPU {g} is not held")
            if not self.idle(g):
                raise ContractError(f"StartGang {j}: GPU {g} is not idle")
            self.state.check_plan(self.gpus[g], d.plan_id)
            full = self.gpus[g].geom.model.full_profile()
            if full.memory_gib + 1e-9 < js.spec.memory_gb:
                raise ContractError(f"StartGang {j}: {js.spec.memory_gb:.1f} GB over "
                                    f"GPU {g}'s {full.memory_gib} GiB")

    def _start(self, d: StartGang) -> None:
        """Every rank of ``d.job`` on the whole of its GPU (a checked start)."""
        from miso.sched.state import Phase

        st, j = self.state, d.job
        js = st.jobs[j]
        (self.queue if js.spec.gang else st.queue).remove(j)
        self.runs[j] = tuple(d.gpus)
        for g in d.gpus:
            gs = self.gpus[g]
            pl = Placement(0, gs.geom.model.full_profile().name)
            gs.jobs.append(j)
            gs.layout = (pl,)
            gs.assignment = {j: pl}
            gs.mps_shares = {}
            gs.pending = d
            gs.phase = Phase.RECONFIGURING
            st.notify(g)
        js.gpu = d.gpus[0]
        js.status = JobStatus.PLACED

    # -- helpers ------------------------------------------------------------------------------
    def _take_off(self, j: str) -> None:
        from miso.sched.state import Phase

        for g in self.runs.pop(j):
            gs = self.gpus.get(g)
            if gs is None:
                continue
            if j in gs.jobs:
                gs.jobs.remove(j)
            gs.assignment.pop(j, None)
            if isinstance(gs.pending, StartGang) and gs.pending.job == j:
                gs.pending = None
            if not gs.jobs and gs.pending is None:
                gs.phase = Phase.IDLE
            self.state.notify(g)

    def _stop(self, j: str, count_restart: bool = True) -> None:
        """Every rank of ``j`` stops; the job goes back to its queue (in submission order)."""
        st = self.state
        js = st.jobs[j]
        if count_restart and js.status is JobStatus.RUNNING:
            js.restarts += 1
        self._take_off(j)
        js.gpu = None
        js.placement = None
        js.status = JobStatus.QUEUED
        q = self.queue if js.spec.gang else st.queue
        q.append(j)
        q.sort(key=lambda x: (st.jobs[x].submitted_at, x))
