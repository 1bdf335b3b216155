"""The simulated world's records: one per job and per GPU (physics state the policies never
see), and the kinds of items on the simulator's clock."""

from __future__ import annotations

from miso.mig import Placement
from miso.sched import JobSpec
from miso.sim.traces import TraceJob

(ARRIVE, COMPLETE, RESUME, PLAN_DONE, PROF_START, PROF_DONE, TICK, PHASE, PROF_RUN,
 EXTERNAL) = range(10)
#: a whole-GPU run (gang) has started on every GPU (:class:`miso.sched.GangStarted`)
GANG_UP = 10


class SimJob:
    __slots__ = ("id", "spec", "duration", "work_left", "rate", "t_last", "version", "token",
                 "truth", "workload", "base_rate", "started", "mode", "placement", "waiting",
                 "submit", "first_start", "finish", "milestone", "alt", "ckpt", "restarts",
                 "lost", "restart_cost", "truths", "factors")

    def __init__(self, tj: TraceJob, spec: JobSpec, truth: dict[str, float], base_rate: float):
        self.id = tj.id
        self.spec = spec
        self.duration = tj.duration_s
        self.work_left = tj.duration_s
        self.rate = 0.0
        self.t_last = 0.0
        self.version = 0
        self.token = 0
        self.truth = truth
        self.workload = tj.workload
        self.base_rate = base_rate
        self.started = False
        self.mode: str | None = None      # mig | mps | prof | whole (gang) | None
        self.placement: Placement | None = None
        self.waiting = False
        self.submit = tj.submit_s
        self.first_start: float | None = None
        self.finish: float | None = None
        self.milestone: float | None = None
        self.alt: str | None = None
        self.ckpt = spec.checkpointable
        self.restarts = 0
        self.lost = 0.0
        self.restart_cost = 0.0   # this job's wait per restart (s), set by the simulator
        #: several GPU models: model -> profile -> speed relative to a whole GPU of the first
        #: model, and model -> speed of a whole GPU (None: one model, ``truth`` holds)
        self.truths: dict[str, dict[str, float]] | None = None
        self.factors: dict[str, float] | None = None


class SimGpu:
    __slots__ = ("id", "geom", "model", "full", "layout", "mig_asg", "mode", "plan", "mps",
                 "prof_jobs", "prof_speeds", "busy", "busy_t", "busy_total", "prof_t0",
                 "prof_levels", "prof_s")

    def __init__(self, gid: str, geom) -> None:  # noqa: ANN001
        self.id = gid
        self.geom = geom
        self.model = geom.model.name
        self.full = Placement(0, geom.model.full_profile().name)
        self.layout: tuple[Placement, ...] = (self.full,)  # GPUs start with MIG on, one 7g
        self.mig_asg: dict[str, Placement] = {}
        self.mode = "mig"
        self.plan = 0
        self.mps: dict[str, int] = {}
        self.prof_jobs: list[str] = []
        self.prof_speeds: dict[str, dict[int, float]] = {}   # job -> level -> speed
        self.busy = False
        self.busy_t = 0.0
        self.busy_total = 0.0
        self.prof_t0 = 0.0
        self.prof_levels: tuple[int, ...] = ()   # run order (100 % last)
        self.prof_s = 0.0
