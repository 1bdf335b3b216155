"""MPS control daemons, one per MIG device, through ``nvidia-cuda-mps-control``.

Each daemon gets its own pipe and log directory and sees only its MIG device
(``CUDA_VISIBLE_DEVICES=<MIG UUID>``). A job joins it with ``CUDA_MPS_PIPE_DIRECTORY=<pipe>``
and limits itself with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``. Stopping sends ``quit`` to the
control program with the same pipe directory. The command runner is injectable for tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from miso.backend.base import BackendError, MpsHandle, NotSupported
from miso.mig import Placement

Runner = Callable[[Sequence[str], Mapping[str, str], str | None], int]
MPS_CONTROL = "nvidia-cuda-mps-control"


def _run(cmd: Sequence[str], env: Mapping[str, str], stdin: str | None) -> int:
    proc = subprocess.run(list(cmd), env=dict(env), input=stdin, text=True,
                          capture_output=True, timeout=30, check=False)
    return proc.returncode


class MpsManager:
    """Start/stop MPS control daemons bound to single MIG devices."""

    def __init__(self, runner: Runner | None = None, control: str = MPS_CONTROL) -> None:
        self._runner = runner or _run
        self._control = control

    def _env(self, uuid: str, pipe: str, log: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": pipe,
                    "CUDA_MPS_LOG_DIRECTORY": log})
        return env

    def start(self, gpu: int, placement: Placement, uuid: str, base_dir: str) -> MpsHandle:
        """Start ``nvidia-cuda-mps-control -d`` for the MIG device ``uuid``."""
        if self._runner is _run and shutil.which(self._control) is None:
            raise NotSupported(f"{self._control} not found on PATH; cannot run MPS")
        root = Path(base_dir) / f"mps-gpu{gpu}-{placement.profile}-{placement.start}"
        pipe, log = root / "pipe", root / "log"
        pipe.mkdir(parents=True, exist_ok=True)
        log.mkdir(parents=True, exist_ok=True)
        rc = self._runner([self._control, "-d"], self._env(uuid, str(pipe), str(log)), None)
        if rc != 0:
            raise BackendError(f"GPU {gpu}: {self._control} -d for {uuid} exited with {rc}")
        return MpsHandle(gpu, placement, str(pipe), str(log), extra={"uuid": uuid})

    def stop(self, handle: MpsHandle) -> None:
        """Ask the daemon to quit (errors ignored: it may already be gone)."""
        uuid = handle.extra.get("uuid", "")
        self._runner([self._control], self._env(uuid, handle.pipe_dir, handle.log_dir), "quit\n")
