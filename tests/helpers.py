"""Helpers shared by the tests (imported as ``from helpers import ...``; the fixtures built on
them are in conftest.py)."""

from __future__ import annotations

import contextlib
import getpass
import importlib.util
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from miso.cluster.local import LocalCluster
from miso.controller import ControllerConfig
from miso.controller.services import ServiceManager, attach_services

#: A well-behaved job (40 progress reports in 2 s, then done): the victim beside hostile jobs
#: in the tests and in benchmarks/security/run.py.
VICTIM = textwrap.dedent("""\
    import time
    from miso import job
    ctx = job.context()
    ctx.started(0, 40)
    for i in range(40):
        time.sleep(0.05)
        ctx.report(i + 1, 40)
    ctx.finish()
""")

#: Controller knobs that make live tests fast (seconds); a test adds its own on top.
FAST: dict[str, float] = {"profile_seconds_per_level": 0.3, "profile_warmup_s": 0.15,
                          "checkpoint_timeout": 3.0, "poll_interval": 0.1}


def emu_iterations(wl: str = "resnet_train128", iters: int = 200, ips: float = 40.0,
                   *extra: str) -> list[str]:
    """The command of an emulated training job (:mod:`miso.emuworkload`) of ``iters``
    iterations at ``ips`` iterations/s on a full GPU."""
    return [sys.executable, "-m", "miso.emuworkload", "--workload", wl, "--iterations",
            str(iters), "--ips", str(ips), *extra]


def emu(wl: str, work_s: float, *extra: str, ips: float = 40.0) -> list[str]:
    """An emulated job of ``work_s`` seconds alone on a full GPU."""
    return emu_iterations(wl, int(work_s * ips), ips, *extra)


class AcceptingPlans:
    """A plan executor that accepts every plan and carries out none: a controller's loop
    driven by hand on a virtual clock, with no agents (``con.loop.executor = ...``)."""

    def submit(self, gpu: str, d: object) -> bool:
        return True

    def remove_gpu(self, gpu: str) -> None:
        pass

    def busy(self) -> bool:
        return False


#: The environment variables that point a client at a cluster; a test of the CLI clears them.
CLIENT_ENV = ("MISO_URL", "MISO_TOKEN", "MISO_CA", "MISO_CONFIG", "MISO_STATE_DIR")


@contextlib.contextmanager
def served_cluster(config: ControllerConfig, prefix: str) -> Iterator[tuple[Path, str]]:
    """A live controller on 2 emulated GPUs (no Ray) with its API as the head serves it, the
    operator bootstrapped: ``(state dir, URL)``. The state dir is under /tmp (``prefix``) so
    jobs run under test Unix accounts can reach it."""
    from miso.api.head import bootstrap_operator, serve
    from miso.cluster.local import LocalCluster

    sd = Path(tempfile.mkdtemp(prefix=prefix))
    lc = LocalCluster(sd, gpus_per_node=2, config=config)
    try:
        assert bootstrap_operator(sd) == os.environ.get("USER", getpass.getuser())
        srv = serve(lc.controller, sd)
        try:
            yield sd, srv.url
        finally:
            srv.stop()
    finally:
        lc.close()
        shutil.rmtree(sd, ignore_errors=True)


def run_cli(*args: str, **env: str) -> Any:
    """``miso ARGS`` in-process (typer's runner) with ``env`` added to the environment."""
    from typer.testing import CliRunner

    from miso.cli import app

    return CliRunner().invoke(app, list(args), env=env or None)


class DecisionRecorder:
    """Observer of the live loop for parity tests: the decisions it applies, with their time."""

    def __init__(self) -> None:
        self.decisions: list[tuple[float, object]] = []

    def on_event(self, now: float, ev: object, state: object) -> None:
        pass

    def on_decision(self, now: float, d: object, state: object) -> None:
        self.decisions.append((now, d))

    def on_timing(self, name: str, seconds: float) -> None:
        pass


class TurnRecorder(DecisionRecorder):
    """Observer of a running loop's turns: each event it delivers and decision it applies,
    in order, as ``(turn, time, kind, job)`` (kind: the event's class name, or
    ``decision:`` and the decision's). A turn is one :meth:`EventLoop.run_once
    <miso.controller.loop.EventLoop.run_once>` (the loop enters :meth:`batch` once per
    turn): the events waiting together in its queue are one group whose placement pass
    runs once, at the group's end, so a test can tell which events a decision followed."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0
        self.seen: list[tuple[int, float, str, str | None]] = []

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        self.turn += 1
        yield

    def on_event(self, now: float, ev: object, state: object) -> None:
        job = getattr(ev, "job", None)
        self.seen.append((self.turn, now, type(ev).__name__, getattr(job, "id", job)))

    def on_decision(self, now: float, d: object, state: object) -> None:
        super().on_decision(now, d, state)
        self.seen.append((self.turn, now, "decision:" + type(d).__name__,
                          getattr(d, "job", None)))


class AcceptingExecutor:
    """Stands in for the plan executor: takes every plan (kept in ``plans``), runs nothing."""

    def __init__(self) -> None:
        self.plans: list[tuple[str, object]] = []

    def submit(self, gpu: str, d: object) -> bool:
        self.plans.append((gpu, d))
        return True

    def remove_gpu(self, gpu: str) -> None:
        pass

    def busy(self) -> bool:
        return False


@contextlib.contextmanager
def service_cluster(tmp_path: Path, gpus_per_node: int,
                    ) -> Iterator[tuple[LocalCluster, ServiceManager]]:
    """An emulated cluster with its service manager in this process, not ticking (the test
    drives ``tick()`` itself); stopped with its jobs, router and replicas afterwards."""
    c = LocalCluster(tmp_path, config=ControllerConfig(**FAST), gpus_per_node=gpus_per_node,
                     rate_window=0.5)
    mgr = attach_services(c.controller, tmp_path, separate_process=False)
    mgr._stop.set()  # noqa: SLF001 - the test drives tick() itself
    yield c, mgr
    mgr.close()
    mgr.server.stop()
    assert c.controller is not None
    c.controller.stop(stop_jobs=True)


def load_script(name: str, path: Path) -> Any:
    """Import a script under benchmarks/ or scripts/ (not a package) as module ``name``; it is
    registered in ``sys.modules`` because dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def profiles_given(log: list[tuple[float, Any]], job: str) -> list[str]:
    """The MIG profiles ``job`` was given in turn in a recorded decision log (``run_policy(...,
    record=True).log``): each layout that changes its slice adds one."""
    from miso.sched import ApplyLayout
    got: list[str] = []
    for _, d in log:
        if isinstance(d, ApplyLayout) and job in d.assignment:
            p = d.assignment[job].profile
            if not got or got[-1] != p:
                got.append(p)
    return got
