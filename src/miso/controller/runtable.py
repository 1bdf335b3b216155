"""The live runs by job, indexed by GPU as well.

``Runtime.runs`` maps a job to its live attempt; the GPU workers ask for the runs of one GPU
several times per plan (:meth:`~miso.controller.runtime.Runtime.runs_on`). With a thousand
jobs running, a scan of every run per question was a large part of their CPU, so the table
keeps a per-GPU index as it is written. A run's GPU never changes while it is in the table.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar


class OnGpu(Protocol):
    """What the index needs of a run."""

    @property
    def gpu(self) -> str: ...


R = TypeVar("R", bound=OnGpu)


class RunTable(dict[str, R]):
    """A ``dict`` of job -> run that also answers :meth:`on` (the runs of one GPU) without a
    scan. Only the writes the controller uses are supported: ``t[job] = run``, ``del t[job]``,
    :meth:`pop` and :meth:`clear`; the others raise."""

    def __init__(self) -> None:
        super().__init__()
        self._by_gpu: dict[str, dict[str, R]] = {}

    def __setitem__(self, job: str, run: R) -> None:
        old = self.get(job)
        if old is not None:
            self._unindex(job, old)
        super().__setitem__(job, run)
        self._by_gpu.setdefault(run.gpu, {})[job] = run

    def __delitem__(self, job: str) -> None:
        run = self[job]
        super().__delitem__(job)
        self._unindex(job, run)

    def pop(self, job: str, *default: Any) -> Any:  # type: ignore[override]
        if job not in self:
            if default:
                return default[0]
            raise KeyError(job)
        run = self[job]
        del self[job]
        return run

    def clear(self) -> None:
        super().clear()
        self._by_gpu.clear()

    def _unsupported(self, *_: Any, **__: Any) -> Any:
        raise TypeError("RunTable: use t[job] = run, del t[job], pop or clear")

    update = setdefault = popitem = __ior__ = _unsupported  # type: ignore[assignment]

    def _unindex(self, job: str, run: R) -> None:
        on = self._by_gpu.get(run.gpu)
        if on is not None:
            on.pop(job, None)
            if not on:
                del self._by_gpu[run.gpu]

    def on(self, gpu: str) -> list[R]:
        """The runs on ``gpu``, in the order they were added."""
        return list(self._by_gpu.get(gpu, {}).values())
