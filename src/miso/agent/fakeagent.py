"""A node agent whose jobs are timers: the agent protocol without processes, for scale tests.

:class:`FakeAgent` answers the same calls as :class:`miso.agent.Agent` (``describe``,
``apply_layout``, ``start_mps``, ``launch``, ``checkpoint``, ``kill``, ``forget``, ``report``
with the lease, ``logs``, ``shutdown``) with the same plain data, so the real controller, store,
poller and decision loop drive it unchanged; 128 of them with 8 emulated GPUs each live in one
process. Its jobs start no process: a job submitted as the reference workload
(``python -m miso.emuworkload --workload W --iterations N --ips R ...``, the same flags) is a
clock that advances as that workload would on its slice (the A100 table on MIG, the MPS speed
model under MPS, ``--phase-at``/``--phase-factor``, ``--restart-s`` warm-up,
``--no-checkpoint``, ``--crash-at-start``, out of memory on a slice too small).

Fencing is the guard's rule, kept in memory: every ``report`` carrying a lease extends it;
once the lease has run out, every running job ends as ``fenced`` (its progress up to the lease
end counts). A checkpoint is a path that names its iteration (``fake-checkpoint:<job>:<it>``),
which the next attempt, on any fake node, resumes from. Progress is evaluated when the
controller looks (a report, a checkpoint, a kill), so an idle cluster costs nothing.

:mod:`miso.cluster.fakeactors` serves it as Ray actors named like the real agents.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from miso.agent.attempt import RateTracker
from miso.backend.base import BackendError, MpsHandle, ReconfigurationError
from miso.backend.emulated import EmulatedBackend
from miso.job import EXIT_CHECKPOINTED
from miso.mig import Placement, canonical
from miso.mps_speed import mps_speed
from miso.nodewire import layout_data, placement_of
from miso.workloads import Workload, workload

#: The path of a fake checkpoint: the job and the iteration it saved.
_CHECKPOINT = re.compile(r"^fake-checkpoint:(?P<job>[^:]+):(?P<it>\d+)$")
#: Return code of a job killed by its guard or by the agent (SIGKILL).
_KILLED = -9
_pids = itertools.count(1_000_000)


class FakeBackend(EmulatedBackend):
    """Emulated GPUs whose instances are in use while a fake job runs on them (no /proc
    scan), and whose MPS daemons are names (no directories)."""

    def __init__(self, count: int, model: str, *, node: str,
                 users: Callable[[int, Placement], list[int]]) -> None:
        super().__init__(count, model, node=node, check_processes=False)
        self._users = users

    def processes(self, gpu: int, placement: Placement) -> list[int]:
        return self._users(gpu, placement)

    def start_mps(self, gpu: int, placement: Placement, base_dir: str) -> MpsHandle:
        if placement not in self.devices(gpu):
            raise BackendError(f"GPU {gpu}: no MIG device at {placement} for MPS")
        pipe = f"fake-mps:{gpu}:{placement.profile}@{placement.start}"
        return MpsHandle(gpu, placement, pipe, pipe)


@dataclass(frozen=True)
class FakeJob:
    """What the workload's flags say of a job (see :func:`fake_job`)."""

    workload: Workload | None
    iterations: int
    ips: float
    phase_at: float | None = None
    phase_factor: float = 1.0
    restart_s: float = 0.0
    checkpoints: bool = True
    crash: str = ""


def fake_job(command: list[str]) -> FakeJob:
    """The timer a command stands for: the reference workload's flags; any other command
    fails at start (a fake node runs nothing else)."""
    return _fake_job(tuple(command))


@functools.lru_cache(maxsize=4096)
def _fake_job(command: tuple[str, ...]) -> FakeJob:
    from miso.emuworkload import arg_parser  # noqa: PLC0415

    if "miso.emuworkload" not in command:
        return FakeJob(None, 0, 0.0, crash="a fake node runs only miso.emuworkload jobs")
    args = list(command[command.index("miso.emuworkload") + 1:])
    try:
        a, _ = arg_parser().parse_known_args(args)
        wl = workload(a.workload)
    except (SystemExit, KeyError) as e:
        return FakeJob(None, 0, 0.0, crash=f"emuworkload: bad arguments ({e})")
    return FakeJob(wl, int(a.iterations), float(a.ips), a.phase_at, float(a.phase_factor),
                   float(a.restart_s), not a.no_checkpoint,
                   "emuworkload: crashing at start as asked (--crash-at-start)"
                   if a.crash_at_start else "")


@dataclass
class FakeAttempt:
    """One attempt of one fake job: its progress as of ``t`` (monotonic seconds)."""

    job: str
    attempt: int
    gpu: int
    placement: Placement
    mps_pct: int | None
    spec: FakeJob
    started: float  # wall clock, as the real agent reports it
    t: float
    done: float
    start_iteration: int
    warm_until: float
    rates: RateTracker
    pid: int = field(default_factory=lambda: next(_pids))
    returncode: int | None = None
    ended: float | None = None
    killed: bool = False
    fenced: bool = False
    checkpoint_requested: bool = False
    checkpoint: tuple[int, str] | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.returncode is None


class FakeAgent:
    """The agent of one fake node (see the module docstring)."""

    def __init__(self, node: str, gpus: int = 8, model: str = "A100-40GB", *,
                 rate_window: float = 1.0, change_threshold: float = 0.25,
                 workdir: str = "") -> None:
        self.node = node
        self.backend = FakeBackend(gpus, model, node=node, users=self._users)
        self.rate_window = rate_window
        self.change_threshold = change_threshold
        self.workdir = workdir
        self.lock = threading.RLock()
        self.attempts: dict[tuple[str, int], FakeAttempt] = {}
        self.ever: set[tuple[str, int]] = set()
        self.mps: set[tuple[int, Placement]] = set()
        #: Wall-clock end of the controller's lease (None: never granted, never fenced).
        self.lease_until: float | None = None

    # ---- lease, description, layouts ----------------------------------------------------

    def renew_lease(self, until: float) -> None:
        with self.lock:
            self.lease_until = max(self.lease_until or 0.0, float(until))

    def ping(self) -> str:
        return self.node

    def free_port(self) -> int:
        return 29500  # nothing listens on a fake node (torch.distributed's default port)

    def describe(self) -> dict[str, Any]:
        gpus = []
        for g in self.backend.gpus():
            devs = self.backend.devices(g.index)
            geom = self.backend.geometry(g.index)
            gpus.append({
                "index": g.index, "uuid": g.uuid, "model": g.model, "mig": g.mig_enabled,
                "layout": layout_data(devs),
                "devices": {f"{p.profile}@{p.start}": d.uuid for p, d in devs.items()},
                "driver": geom.driver, "profiles": [p.name for p in geom.profiles]})
        return {"node": self.node, "backend": "fake", "pid": 0, "workdir": self.workdir,
                "gpus": gpus}

    def apply_layout(self, gpu: int, layout: list[Any]) -> dict[str, Any]:
        target = canonical(placement_of(x) for x in layout)
        with self.lock:
            self._advance_all()
            self.mps = {k for k in self.mps if k[0] != gpu or k[1] in set(target)}
            try:
                now = self.backend.apply_layout(gpu, target)
                return {"ok": True, "layout": layout_data(now), "error": "", "kind": ""}
            except ReconfigurationError as e:
                return {"ok": False, "layout": layout_data(e.layout), "error": str(e),
                        "kind": e.kind}
            except BackendError as e:
                return {"ok": False, "layout": layout_data(self.backend.read_layout(gpu)),
                        "error": str(e), "kind": e.kind}

    def read_layout(self, gpu: int) -> list[list[Any]]:
        return layout_data(self.backend.read_layout(gpu))

    def start_mps(self, gpu: int, placement: Any) -> str:
        pl = placement_of(placement)
        with self.lock:
            h = self.backend.start_mps(gpu, pl, "")
            self.mps.add((gpu, pl))
            return h.pipe_dir

    def stop_mps(self, gpu: int) -> None:
        with self.lock:
            self.mps = {k for k in self.mps if k[0] != gpu}

    def _users(self, gpu: int, pl: Placement) -> list[int]:
        return [a.pid for a in self.attempts.values()
                if a.running and a.gpu == gpu and a.placement == pl]

    # ---- the jobs' clocks ---------------------------------------------------------------

    def _speed(self, a: FakeAttempt) -> float | None:
        """Iterations per second of ``a`` now (None: it does not fit its slice)."""
        wl = a.spec.workload
        assert wl is not None
        geom = self.backend.geometry(a.gpu)
        prof = geom.model.profile(a.placement.profile)
        if a.mps_pct is not None:
            n = sum(1 for b in self.attempts.values() if b.running and b.gpu == a.gpu
                    and b.placement == a.placement and b.mps_pct is not None)
            speed = mps_speed(wl.name, float(a.mps_pct), max(1, n))
        else:
            sp = wl.speed(prof.compute_slices)
            if sp is None:
                return None
            speed = sp
        if a.spec.phase_at is not None and a.done >= a.spec.phase_at * a.spec.iterations:
            speed *= a.spec.phase_factor
        return a.spec.ips * speed

    def _advance(self, a: FakeAttempt, now: float) -> None:
        """Bring ``a`` to monotonic time ``now`` (it finishes when its iterations are done)."""
        if not a.running or now <= a.t:
            return
        t = max(a.t, min(now, a.warm_until))
        while t < now and a.done < a.spec.iterations:
            rate = self._speed(a) or 0.0
            if rate <= 0:
                break
            step_end = now
            ph = a.spec.phase_at
            if ph is not None and a.done < ph * a.spec.iterations:  # split at the phase
                step_end = min(now, t + (ph * a.spec.iterations - a.done) / rate)
            left = (a.spec.iterations - a.done) / rate
            if t + left <= step_end:
                a.done, t = float(a.spec.iterations), t + left
                a.returncode, a.ended = 0, time.time() - (now - t)
                a.lines.append(f"{{\"workload\": \"{a.spec.workload.name}\", "  # type: ignore
                               f"\"iterations\": {a.spec.iterations}, \"done\": true}}")
                break
            a.done += (step_end - t) * rate
            t = step_end
        a.t = now
        a.rates.add(time.time() - (time.monotonic() - now), float(int(a.done)))

    def _advance_all(self) -> None:
        """Every running job to now, or to the lease's end (then fenced) if it ran out."""
        mono, wall = time.monotonic(), time.time()
        fence = self.lease_until is not None and wall > self.lease_until
        until = mono - (wall - self.lease_until) if fence else mono  # type: ignore[operator]
        for a in list(self.attempts.values()):
            if a.running:
                self._advance(a, until)
                if fence and a.running:
                    a.returncode, a.ended, a.fenced = _KILLED, wall, True
                    a.lines.append("guard: the controller's lease ran out: job killed")

    # ---- jobs ---------------------------------------------------------------------------

    def launch(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Start one fake attempt (the keys of :meth:`miso.agent.Agent.launch`)."""
        job, attempt = str(spec["job"]), int(spec["attempt"])
        gpu, pl = int(spec["gpu"]), placement_of(spec["placement"])
        log = f"fake:{self.node}/{job}/attempt-{attempt}"
        with self.lock:
            self._advance_all()
            a = self.attempts.get((job, attempt))
            if a is not None and a.running:
                return {"ok": True, "pid": a.pid, "error": "", "log": log}
            if (job, attempt) in self.ever:
                return {"ok": False, "pid": None, "log": log,
                        "error": f"attempt {attempt} of {job} was run before on {self.node}: "
                                 f"attempt numbers are never reused"}
            if pl not in self.backend.devices(gpu):
                return {"ok": False, "pid": None, "log": log,
                        "error": f"cannot start {spec.get('command')!r} on GPU {gpu} {pl}: "
                                 f"no such MIG instance"}
            self.ever.add((job, attempt))
            fj = fake_job([str(c) for c in spec.get("command") or []])
            m = _CHECKPOINT.match(str(spec.get("resume_from") or ""))
            start = int(m["it"]) if m and fj.checkpoints else 0
            mono = time.monotonic()
            warm = fj.restart_s if attempt > 1 else 0.0
            a = FakeAttempt(job, attempt, gpu, pl, None if spec.get("mps_pct") is None else
                            int(spec["mps_pct"]), fj, time.time(), mono, float(start), start,
                            mono + warm, RateTracker(self.rate_window, self.change_threshold))
            self.attempts[(job, attempt)] = a
            if fj.crash:
                a.returncode, a.ended = 1, time.time()
                a.lines.append(fj.crash)
            elif self._speed(a) is None:
                assert fj.workload is not None
                a.returncode, a.ended = 1, time.time()
                a.lines.append(f"emuworkload: CUDA out of memory: {fj.workload.name} does "
                               f"not fit {pl.profile}")
            else:
                a.rates.add(time.time(), float(start))
            return {"ok": True, "pid": a.pid, "error": "", "log": log}

    def checkpoint(self, job: str, attempt: int) -> bool:
        """Save and stop (exit code 75), as the workload does when asked; a job that cannot
        checkpoint ignores it (the controller kills it after its timeout)."""
        with self.lock:
            self._advance_all()
            a = self.attempts.get((job, attempt))
            if a is None or not a.running:
                return False
            a.checkpoint_requested = True
            if a.spec.checkpoints and a.done < a.spec.iterations:
                it = int(a.done)
                a.checkpoint = (it, f"fake-checkpoint:{job}:{it}")
                a.returncode, a.ended = EXIT_CHECKPOINTED, time.time()
                a.lines.append(f"emuworkload: checkpointed at {it}")
            return True

    def kill(self, job: str, attempt: int) -> bool:
        with self.lock:
            self._advance_all()
            a = self.attempts.get((job, attempt))
            if a is None:
                return False
            if a.running:
                a.returncode, a.ended, a.killed = _KILLED, time.time(), True
            return True

    def forget(self, job: str, attempt: int) -> None:
        with self.lock:
            a = self.attempts.get((job, attempt))
            if a is not None and not a.running:
                del self.attempts[(job, attempt)]

    def report(self, lease_until: float | None = None) -> dict[str, Any]:
        """Every attempt's state, the keys of :func:`miso.agent.attempt.attempt_report`."""
        with self.lock:
            self._advance_all()  # a lapsed lease fences before the renewal
            if lease_until is not None:
                self.renew_lease(lease_until)
            return {"node": self.node, "time": time.time(),
                    "jobs": [self._report(a) for a in self.attempts.values()]}

    def _report(self, a: FakeAttempt) -> dict[str, Any]:
        status = "running" if a.running else (
            "finished" if a.returncode == 0 else
            "checkpointed" if a.returncode == EXIT_CHECKPOINTED else
            "killed" if a.killed else "fenced" if a.fenced else "failed")
        ck = a.checkpoint
        return {
            "job": a.job, "attempt": a.attempt, "pid": a.pid, "gpu": a.gpu,
            "placement": [a.placement.start, a.placement.profile], "mps_pct": a.mps_pct,
            "status": status, "returncode": a.returncode,
            "iteration": int(a.done), "total": a.spec.iterations or None,
            "time": time.time(), "start_iteration": a.start_iteration,
            "checkpoint_iteration": ck[0] if ck else None,
            "checkpoint_path": ck[1] if ck else None,
            "steady_rate": a.rates.steady, "rate": a.rates.rate(a.rates.window),
            "change_seq": a.rates.change_seq,
            "change": list(a.rates.change) if a.rates.change else None,
            "checkpoint_requested": a.checkpoint_requested,
            "checkpointable": a.spec.checkpoints,
            "started": a.started, "ended": a.ended, "log": f"fake:{self.node}/{a.job}",
            "log_tail": "\n".join(a.lines[-20:]) if status == "failed" else "",
            "report_error": "",
        }

    def logs(self, job: str, tail: int = 200) -> str:
        with self.lock:
            out = []
            for (j, n), a in sorted(self.attempts.items()):
                if j == job:
                    out.append(f"--- {job} attempt-{n} on {self.node} ---")
                    out.extend(a.lines[-tail:])
            return "\n".join(out)

    def running_pids(self) -> list[int]:
        with self.lock:
            return [a.pid for a in self.attempts.values() if a.running]

    def shutdown(self, *, destroy_instances: bool = False) -> None:
        with self.lock:
            for a in self.attempts.values():
                if a.running:
                    a.returncode, a.ended, a.killed = _KILLED, time.time(), True
            self.mps.clear()
            if destroy_instances:
                for g in self.backend.gpus():
                    self.backend.apply_layout(g.index, ())
