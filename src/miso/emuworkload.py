"""Reference emulated training workload: "trains" at the speed the A100 table gives.

``python -m miso.emuworkload --workload resnet_train128 --iterations 300 --ips 50``

* On a MIG slice (``MISO_EMULATED_PROFILE``/``MISO_EMULATED_COMPUTE_SLICES`` set by the emulated
  backend) it runs at ``ips * speed(slices)`` iterations/s, ``speed`` from the catalogue
  (:mod:`miso.workloads`); a slice with too little memory fails like CUDA does (out of memory,
  exit 1).
* Under MPS (``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) it registers
  itself in the pipe directory, reads its co-runners from there and runs at the speed of the MPS
  speed model the simulator uses (:mod:`miso.mps_speed`), re-read every 0.2 s.
* Otherwise it runs at full speed (``--ips``).

``--ips`` is the time scale: iterations per second alone on a full GPU. ``--phase-at F
--phase-factor X`` multiplies the speed by X after fraction F of the iterations (a phase change).
``--crash-at-start`` exits 1 at once; ``--checkpoint-every S`` saves every S seconds besides the
saves miso requests. Uses :mod:`miso.job` to report progress, checkpoint and resume.

Restart cost, as the simulator models it: ``--restart-s S`` makes every start after the first
(``MISO_ATTEMPT`` > 1: a restart after a checkpoint, a repartition or an MPS level switch) spend
S seconds warming up (process start, CUDA context, data loaders, restore) before progress
resumes. ``--no-checkpoint`` emulates a job that cannot checkpoint: it ignores checkpoint
requests (miso kills it after its checkpoint timeout) and restarts from iteration 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from miso import job as jobhelper
from miso.workloads import workload


def mps_speed(name: str, level_pct: float, co_runners: Sequence[tuple[str, float]]) -> float:
    """Speed (relative to alone on the full GPU) of ``name`` at ``level_pct`` with co-runners.

    The simulator's model, :func:`miso.mps_speed.mps_speed` (co-runners share the same thread
    level, so only their number matters).
    """
    from miso import mps_speed as model  # noqa: PLC0415 - only under MPS

    return model.mps_speed(name, level_pct, 1 + len(co_runners))


class _MpsRegistry:
    """Registration of emulated MPS clients in the daemon's pipe directory."""

    def __init__(self, pipe_dir: str, name: str, level: float) -> None:
        self.dir = Path(pipe_dir) / "miso-clients"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.me = self.dir / f"{os.getpid()}.json"
        jobhelper.write_json_atomic(self.me, {"workload": name, "level": level})

    def co_runners(self) -> list[tuple[str, float]]:
        out = []
        for f in self.dir.glob("*.json"):
            if f == self.me:
                continue
            try:
                os.kill(int(f.stem), 0)
            except (ProcessLookupError, ValueError):
                f.unlink(missing_ok=True)
                continue
            except PermissionError:
                pass
            data = jobhelper.read_json(f)
            if isinstance(data, dict):
                out.append((str(data["workload"]), float(data["level"])))
        return sorted(out)

    def close(self) -> None:
        self.me.unlink(missing_ok=True)


def arg_parser() -> argparse.ArgumentParser:
    """The workload's flags (also read by :mod:`miso.agent.fakeagent`, which runs the same
    jobs as timers)."""
    ap = argparse.ArgumentParser(prog="python -m miso.emuworkload", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--workload", required=True, help="catalogue workload, e.g. bert_train2")
    ap.add_argument("--iterations", type=int, required=True)
    ap.add_argument("--ips", type=float, default=20.0,
                    help="iterations per second alone on a full GPU (time scale)")
    ap.add_argument("--checkpoint-every", type=float, default=0.0, help="seconds (0: only "
                    "when asked)")
    ap.add_argument("--phase-at", type=float, default=None)
    ap.add_argument("--phase-factor", type=float, default=1.0)
    ap.add_argument("--crash-at-start", action="store_true", help="exit 1 at once")
    ap.add_argument("--restart-s", type=float, default=0.0,
                    help="warm-up seconds of every start after the first (restart cost)")
    ap.add_argument("--no-checkpoint", action="store_true",
                    help="ignore checkpoint requests and restart from 0 (a job without "
                    "checkpointing)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = arg_parser().parse_args(argv)
    if not (a.restart_s >= 0 and a.restart_s < 1e6):
        print("emuworkload: --restart-s must be a number of seconds >= 0", file=sys.stderr)
        return 2
    try:
        wl = workload(a.workload)
    except KeyError as e:
        print(f"emuworkload: {e.args[0]}", file=sys.stderr)
        return 2
    if a.crash_at_start:
        print("emuworkload: crashing at start as asked (--crash-at-start)", file=sys.stderr)
        return 1

    ctx = jobhelper.context()
    env = os.environ
    profile = env.get("MISO_EMULATED_PROFILE")
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
    registry = None
    if pipe and env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        level = float(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
        registry = _MpsRegistry(pipe, wl.name, level)

        cache: dict[tuple[tuple[str, float], ...], float] = {}

        def base_speed() -> float:
            key = tuple(registry.co_runners())
            if key not in cache:
                cache[key] = mps_speed(wl.name, level, key)
            return cache[key]
        where = f"MPS {level:g}% on {profile or 'GPU'}"
    elif profile:
        slices = int(env.get("MISO_EMULATED_COMPUTE_SLICES", profile.split("g")[0]))
        mem = float(env.get("MISO_EMULATED_MEMORY_GIB", "1e9"))
        sp = wl.speed(slices)
        if sp is None:  # the A100 table has no speed there: it did not fit
            print(f"emuworkload: CUDA out of memory: {wl.name} (peak {wl.memory_gb:.1f} GB) "
                  f"does not fit {profile} ({mem:g} GiB)", file=sys.stderr)
            return 1
        fixed = sp

        def base_speed() -> float:
            return fixed
        where = f"MIG {profile}"
    else:
        def base_speed() -> float:
            return 1.0
        where = "whole GPU"

    state = (None if a.no_checkpoint else ctx.load()) or {}
    done = float(state.get("iteration", 0))
    ctx.started(int(done), a.iterations, checkpointable=not a.no_checkpoint)

    def answer_checkpoint() -> None:
        """Save and exit when miso asks (a job without checkpointing ignores it)."""
        if ctx.checkpoint_requested() and not a.no_checkpoint and done < a.iterations:
            ctx.save_json({"iteration": int(done)}, iteration=int(done))
            print(f"emuworkload {wl.name}: checkpointed at {int(done)}", flush=True)
            ctx.exit_checkpointed()

    print(f"emuworkload {wl.name}: {where}, resuming at {int(done)}/{a.iterations}", flush=True)
    if a.restart_s > 0 and ctx.attempt > 1:
        # Warm-up of a restarted job: no progress until it is over (checkpoint requests during
        # it are answered with the state loaded, so nothing is lost twice).
        t_end = time.monotonic() + a.restart_s
        while time.monotonic() < t_end:
            time.sleep(0.05)
            answer_checkpoint()
    speed = base_speed()
    last_speed_read = last_save = t = time.monotonic()
    try:
        while done < a.iterations:
            time.sleep(0.05)
            now = time.monotonic()
            if registry is not None and now - last_speed_read > 0.2:
                speed, last_speed_read = base_speed(), now
            factor = a.phase_factor if a.phase_at is not None and \
                done >= a.phase_at * a.iterations else 1.0
            done = min(float(a.iterations), done + (now - t) * a.ips * speed * factor)
            t = now
            ctx.report(int(done), a.iterations)
            if a.no_checkpoint:
                continue
            if a.checkpoint_every and now - last_save >= a.checkpoint_every:
                ctx.save_json({"iteration": int(done)}, iteration=int(done))
                last_save = now
            answer_checkpoint()
    finally:
        if registry is not None:
            registry.close()
    ctx.report(a.iterations, a.iterations, force=True)
    ctx.finish()
    print(json.dumps({"workload": wl.name, "iterations": a.iterations, "done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
