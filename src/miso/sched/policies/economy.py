"""miso+'s restart economy: what a restart costs over the time a plan is expected to stand,
from each job's remaining work, and the slice kept free for the next arrival.

A mixin of :class:`~miso.sched.policies.misoplus.MisoPlus` (it reads the policy's knobs:
``restart_s``, ``economy``, ``replans``, ``horizon_quantile``, ``default_remaining_s``,
``reserve``, ``max_jobs``, its arrival clock ``clock``, the current ``state`` and ``now``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

from miso.mig import Placement
from miso.sched.decisions import ApplyLayout, Decision
from miso.sched.policies.base import Scratch
from miso.sched.policies.priors import prior_speeds
from miso.sched.state import ClusterState

#: A restart not seen to end within this many ``restart_s`` (1 min at least) is not measured.
STALE = 20.0


class Relaunches:
    """Relaunched jobs not seen resuming yet: job -> (the plan that restarted it, its
    acknowledgement), in insertion order (a dict's), with what makes learning from them cost
    what changed, not every relaunch in flight at every call: the jobs that reported progress
    since (``ClusterState.watch_progress``) and a heap of when each goes stale."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[float, float]] = {}
        self._seq: dict[str, int] = {}       # job -> insertion number (the dict's order)
        self._n = 0
        self._expiry: list[tuple[float, str]] = []
        self._reported: set[str] = set()
        self._state: ClusterState | None = None

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, job: object) -> bool:
        return job in self.entries

    def __setitem__(self, job: str, value: tuple[float, float]) -> None:
        if job not in self.entries:
            self._seq[job] = self._n
            self._n += 1
        self.entries[job] = value
        self._reported.add(job)  # a report may have come before this call saw the ack
        heapq.heappush(self._expiry, (value[0], job))

    def __delitem__(self, job: str) -> None:
        del self.entries[job]
        self._seq.pop(job, None)

    def pop(self, job: str, default: Any = None) -> Any:
        if job not in self.entries:
            return default
        got = self.entries[job]
        del self[job]
        return got

    def items(self) -> Iterator[tuple[str, tuple[float, float]]]:
        return iter(list(self.entries.items()))

    def _note(self, job: str) -> None:
        if job in self.entries:
            self._reported.add(job)

    def changed(self, state: ClusterState, stale_after: float
                ) -> list[tuple[str, tuple[float, float]]]:
        """The entries that may resolve now, in insertion order: reported since the last
        call, or (by the heap) at least ``stale_after`` old (a superset; the caller decides)."""
        if state is not self._state:
            self._state = state
            state.watch_progress(self._note)
            self._reported.update(self.entries)
        cand = self._reported
        self._reported = set()
        horizon = state.now - stale_after
        exp = self._expiry
        due: set[str] = set()
        while exp and exp[0][0] <= horizon + 1e-6:
            due.add(heapq.heappop(exp)[1])
        for j in due:  # kept in the heap until gone (the caller's test is the exact one)
            if j in self.entries:
                heapq.heappush(exp, (self.entries[j][0] + 1e-3, j))
        cand |= due
        got = sorted((self._seq[j], j) for j in cand if j in self.entries)
        return [(j, self.entries[j]) for _, j in got]


class RestartEconomy:
    """Pricing of restarts and reservation of headroom (see the module docstring)."""

    restart_s: float
    economy: bool
    replans: float
    horizon_quantile: float
    batch_horizon_quantile: float
    in_batch: Any
    default_remaining_s: float
    reserve: bool
    max_jobs: int
    clock: Any
    state: Any
    now: float
    trigger: str
    heavy_load: Any
    learn_restart_cost: bool
    ran: set[str]
    restarting: dict[str, dict[str, float]]   # gpu -> job -> when a plan restarted it
    relaunching: Relaunches             # job -> (that plan, its ack), not resumed
    restart_seen: dict[str, float]      # job -> its measured restart cost (s)
    restart_stats: list[float]          # [sum, count] of every cost measured
    work_seen: dict[str, float]         # job -> its work when first seen reporting (s)
    work_stats: list[float]             # [sum, count] of those

    def restart_cost(self, job: str) -> float:
        """What restarting ``job`` costs (s): its own measured cost (decision to its first
        progress report after the relaunch: checkpoint, reconfiguration, start, warm-up,
        restore) with ``learn_restart_cost``; else the mean of the costs measured so far
        (three at least); else the configured ``restart_s``."""
        if not self.learn_restart_cost:
            return self.restart_s
        got = self.restart_seen.get(job)
        if got is not None:
            return got
        total, n = self.restart_stats
        return total / n if n >= 3 else self.restart_s

    def note_restarts(self, now: float, out: list[Decision]) -> None:
        """Remember when this call's plans restart a running job (before the state applies
        them), per GPU, to measure how long the job takes to report progress again."""
        if not self.learn_restart_cost:
            return
        st = self.state
        for d in out:
            if isinstance(d, ApplyLayout):
                cur = st.gpus[d.gpu].assignment if d.gpu in st.gpus else {}
                for j, pl in d.assignment.items():
                    if j in self.ran and cur.get(j) != pl:
                        self.restarting.setdefault(d.gpu, {})[j] = now

    def note_applied(self, now: float, gpu: str) -> None:
        """A plan of ``gpu`` is carried out: its restarted jobs' old runs are stopped (live,
        the executor acknowledges after stopping and relaunching), so a progress report
        from now on is the new run's."""
        for j, t0 in self.restarting.pop(gpu, {}).items():
            js = self.state.jobs.get(j)
            if js is not None and js.gpu == gpu and js.finished_at is None:
                self.relaunching[j] = (t0, now)

    def learn_restart_costs(self) -> None:
        """Read each relaunched job's first progress report after the plan's
        acknowledgement (folded into its state by the driver, live or simulated; not a last
        report of the old run) as its restart cost: from the plan to that report. Only the
        relaunches that can have changed are looked at (:meth:`Relaunches.changed`)."""
        st = self.state
        limit = STALE * max(self.restart_s, 60.0)
        for j, (t0, acked) in self.relaunching.changed(st, limit):
            js = st.jobs.get(j)
            p = js.progress if js is not None else None
            if js is None or js.finished_at is not None or \
                    st.now - t0 > limit:
                del self.relaunching[j]  # ended, or no relaunch seen: nothing to learn
            elif p is not None and p[0] > acked and p[2] > 0:
                self.restart_seen[j] = p[0] - t0
                self.restart_stats[0] += p[0] - t0
                self.restart_stats[1] += 1
                del self.relaunching[j]

    def remaining(self, job: str) -> float:
        """Work the job has left (seconds alone on a full GPU) from its progress reports,
        folded into its state by the driver (:meth:`JobState.remaining_work`);
        :meth:`typical_work` when it reports none."""
        st = self.state
        js = st.jobs.get(job) if st is not None else None
        r = js.remaining_work(st.now) if js is not None else None  # type: ignore[union-attr]
        if r is None:
            return self.typical_work()
        if job not in self.work_seen and js.progress is not None:  # type: ignore[union-attr]
            self.work_seen[job] = js.progress[1]  # type: ignore[union-attr]
            self.work_stats[0] += js.progress[1]  # type: ignore[union-attr]
            self.work_stats[1] += 1
        return max(1.0, r)

    def typical_work(self) -> float:
        """Work of a job that reported none yet (live, a newcomer declares no work): the mean
        work the other jobs had when first seen reporting, else
        ``default_remaining_s``. In the simulator every checkpointable job declares its work
        at submission, so this prices only jobs that never report; live, without it every
        newcomer looked like ``default_remaining_s`` (3,000 s) of work and the demo's 12 s
        jobs waited for whole GPUs where the simulator shared them."""
        total, n = self.work_stats
        return total / n if n >= 1 else self.default_remaining_s

    def horizon(self, jobs: list[str], speeds: dict[str, dict[str, float]],
                current: dict[str, Placement]) -> float:
        """How long a plan for these jobs is expected to stand (s): the ``horizon_quantile``
        of their remaining times at current speeds (0.5: the median), divided by the number of
        times the GPU is expected to be re-planned meanwhile. While jobs keep arriving that is
        ``replans`` (every arrival and completion re-plans a GPU; 25 measured best, see
        benchmarks/README.md), so only large gains pay for a restart and free slices are kept
        for the next arrival; once arrivals stop (:meth:`ArrivalClock.quiet`) a plan stands
        until the GPU's own jobs end, so jobs grow into idle slices. In a fixed mix (no
        arrival at all after the batch) the ``batch_horizon_quantile`` (0.75) is used: the
        layout stands longer, so a restart must buy more (measured best, "No regret")."""
        ts = []
        for j in jobs:
            pl = current.get(j)
            s = speeds[j].get(pl.profile, 0.5) if pl is not None else 0.5
            ts.append(self.remaining(j) / max(s, 0.05))
        ts.sort()
        if not ts:
            return self.restart_s
        q = self.batch_horizon_quantile if self.in_batch() else self.horizon_quantile
        t = ts[min(len(ts) - 1, int(q * len(ts)))]
        k = float(len(ts)) if self.clock.quiet(self.now) else self.replans
        return max(self.restart_s, t / max(1.0, k))

    def restart_prices(self, jobs: list[str], speeds: dict[str, dict[str, float]],
                       current: dict[str, Placement]
                       ) -> tuple[float | None, dict[str, float]]:
        """(horizon, throughput each running job's restart costs over it): the work the job
        does not do while it restarts (:meth:`restart_cost` x speed) spread over the plan's
        :meth:`horizon`. ``(None, {})`` without ``economy`` or when nothing runs."""
        if not (self.economy and current):
            return None, {}
        horizon = self.horizon(jobs, speeds, current)
        return horizon, {j: self.restart_cost(j) * speeds[j].get(pl.profile, 0.5) / horizon
                         for j, pl in current.items()}

    def headroom(self, sc: Scratch, g: str, jobs: list[str]) -> dict[str, float] | None:
        """Prior speeds of the next newcomer when one is expected on ``g`` before its jobs'
        median remaining time (arrivals spread over the GPUs, nothing queued): the plan then
        keeps a slice free for it, so its arrival restarts nobody. None otherwise, and at
        light load (the policy's ``heavy_load`` false: sharing is not expected)."""
        if not self.reserve or self.trigger == "profiled" or self.clock.quiet(self.now):
            return None
        if not self.heavy_load(sc):
            return None  # light load: the next newcomer finds an idle GPU or waits for one
        st = sc.state
        gs = st.gpus[g]
        gap = self.clock.mean_gap()
        if gap is None or len(jobs) + 1 > min(self.max_jobs, gs.geom.model.max_instances):
            return None
        if any(j not in sc.placed for j in sc.state.queue) or sc.requeued:
            return None  # queued jobs take free slices at once
        first = self.first_candidate(sc, jobs[0])
        if first is None or first[0] < len(jobs):
            return None  # an idle or less crowded GPU takes the next arrival
        ts = sorted(self.remaining(j) for j in jobs)
        if gap * len(st.gpus) >= ts[len(ts) // 2]:
            return None
        return prior_speeds(gs.geom, self.clock.median_memory()) or None
