"""Helpers shared by the tests (imported as ``from helpers import ...``; the fixtures built on
them are in conftest.py)."""

from __future__ import annotations

import sys
import textwrap

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
