"""A window of recent job arrivals: the mean gap between jobs, whether arrivals have stopped,
the typical newcomer's memory and work, the load they offer (Little's law). Pure bookkeeping of
a stream of arrivals (time, memory, declared work), fed by its owner (miso+'s learners,
:mod:`miso.sched.policies.misoplus`); no policy rule."""

from __future__ import annotations

from collections import deque


class ArrivalClock:
    """The last ``window`` arrivals (time, memory, declared work)."""

    def __init__(self, quiet_gaps: float, window: int = 32, load_window: int = 128) -> None:
        self.quiet_gaps = quiet_gaps
        self.times: deque[float] = deque(maxlen=window)
        self.memory: deque[float] = deque(maxlen=window)
        # The offered load is averaged over more arrivals: a short burst must not make a
        # lightly loaded cluster look busy.
        self.long: deque[float] = deque(maxlen=load_window)
        self.work: deque[float | None] = deque(maxlen=load_window)
        self.undeclared = 0   # entries of ``work`` that are None
        #: mean inter-arrival time of the window (None before two distinct arrivals), computed
        #: as each arrival is noted (the hottest question of miso+'s stages)
        self.gap: float | None = None
        #: :meth:`offered_load`'s answers by its arguments since the last arrival (asked per
        #: plan and per burst test, it changes only with an arrival; the default work only
        #: counts while some job in the window declared none)
        self.loads: dict[tuple[float, int], float | None] = {}

    def note(self, now: float, memory_gb: float, work_s: float | None = None) -> None:
        self.times.append(now)
        self.loads.clear()
        a = self.times
        self.gap = (a[-1] - a[0]) / (len(a) - 1) if len(a) >= 2 and a[-1] > a[0] else None
        self.memory.append(memory_gb)
        self.long.append(now)
        if len(self.work) == self.work.maxlen and self.work[0] is None:
            self.undeclared -= 1  # falls out of the window
        if work_s is None:
            self.undeclared += 1
        self.work.append(work_s)

    def offered_load(self, default_work_s: float, min_samples: int = 16) -> float | None:
        """GPUs the recent arrivals keep busy on average (mean work per job, in full-GPU
        seconds, over the mean gap: Little's law), at its lower bound: the rate is estimated
        from m arrivals (relative error ~ 1/sqrt(m)), so a few short gaps early on must not
        make a lightly loaded cluster look busy. ``default_work_s`` for a job that declared
        none. None before ``min_samples`` arrivals (a few gaps say little about the rate)."""
        a, key = self.long, (default_work_s if self.undeclared else 0.0, min_samples)
        if key not in self.loads:  # (the mean gap inline: the same floats in the same order)
            w = [default_work_s if x is None else x for x in self.work] if self.undeclared \
                else self.work  # the same floats, summed in the same order
            self.loads[key] = None if len(a) < min_samples or a[-1] <= a[0] else (  # type: ignore
                sum(w) / len(w) / ((a[-1] - a[0]) / (len(a) - 1)) * (1.0 - 1.0 / len(a) ** 0.5))
        return self.loads[key]

    def quiet(self, now: float) -> bool:
        """No job has arrived for ``quiet_gaps`` mean inter-arrival times (or none ever)."""
        return self.gap is None or now - self.times[-1] > self.quiet_gaps * self.gap

    def quiet_from(self) -> float | None:
        """When arrivals count as stopped if none comes first (a little after the limit, so
        a timer set for it finds :meth:`quiet` true)."""
        return None if self.gap is None else self.times[-1] + self.quiet_gaps * self.gap * 1.01

    def median_memory(self) -> float:
        m = sorted(self.memory)
        return m[len(m) // 2] if m else 0.0
