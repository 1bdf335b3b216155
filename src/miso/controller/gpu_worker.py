"""One thread per GPU that carries out that GPU's decisions in order.

A queued plan is skipped when a newer plan for the same GPU is queued behind it (the core
ignores acks of superseded plans); a requeue is never skipped.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Protocol

from miso.sched import Decision, RequeueJob


class DecisionRunner(Protocol):
    """What a worker hands each decision to (the executor's ``PlanExecutor``)."""

    def execute_on_gpu(self, gpu: str, d: Decision, worker: GpuWorker) -> None: ...


class GpuWorker:
    """Executes one GPU's decisions in order (see the module docstring)."""

    def __init__(self, executor: DecisionRunner, gpu: str) -> None:
        self.executor = executor
        self.gpu = gpu
        self._ops: deque[Decision] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._latest_plan = 0
        self._current: Decision | None = None
        self._t = threading.Thread(target=self._run, name=f"miso-gpu-{gpu}", daemon=True)
        self._t.start()

    def submit(self, d: Decision) -> None:
        with self._cond:
            pid = getattr(d, "plan_id", None)
            if pid is not None:
                self._latest_plan = max(self._latest_plan, pid)
            self._ops.append(d)
            self._cond.notify()

    def superseded(self, d: Decision) -> bool:
        pid = getattr(d, "plan_id", None)
        return pid is not None and pid < self._latest_plan

    def pending(self) -> bool:
        with self._cond:
            return bool(self._ops) or self._current is not None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._ops.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._ops and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                d = self._ops.popleft()
                if self.superseded(d) and not isinstance(d, RequeueJob):
                    continue
                self._current = d
            try:
                self.executor.execute_on_gpu(self.gpu, d, self)
            finally:
                with self._cond:
                    self._current = None
