"""GPUs' expected free times, kept incrementally (issue 27: the admission scan grew with the trace).

miso+'s admission asks, once per decision while a queue stands, how soon the first few GPUs will
have ended all their jobs (:func:`end_time`: each resident's remaining work at its slice's
estimated speed). A scan of every GPU per ask made the simulator's cost per event grow with the
trace. Here each GPU's time is recomputed only when its inputs change (its residents or plans:
the state's GPU hook; a resident's progress report: the progress hook; a resident's estimate:
:class:`WatchedDict`; the typical work, for residents that report none) or when it may be among
the soonest.

Why a time computed earlier still bounds it: while its inputs stay, a GPU's free time ``v`` falls
as time passes at most at its ``slope`` (the largest ``rate / speed`` of its residents), so
``v + C * now`` never decreases for ``C >= slope``: a key computed earlier is a lower bound now
(the :mod:`miso.sched.ranking` argument). GPUs sit in one heap per slope class ``C``; steeper
ones are evaluated at every ask. An ask pops bounds in order, computes those GPUs' times exactly
(the same floats as a scan) and stops once ``m`` exact times lie strictly below every bound
left, so the answer is the scan's: the ``m`` soonest, ties in the state's GPU order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

from miso.jobstatus import CORE_ENDED
from miso.sched.state import ClusterState

#: The slope classes (seconds of free time lost per second); steeper GPUs are always evaluated.
SLOPES = (0.0, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 25.0)
#: A GPU's time: (seconds until free, slope, whether it used the typical work)
Timed = tuple[float, float, bool]


def end_time(residents: list[str], asg: dict[str, Any], full: str, ctx: tuple[Any, ...]
             ) -> Timed:
    """Seconds until every job of a GPU (``residents``, its assignment ``asg``) has ended at
    its current slice's speed (its estimate there, else 1.0 on the whole GPU ``full`` and 0.5
    on a slice), with the GPU's slope and whether the typical work was used. The work left is
    :meth:`WorkLearner.remaining` inlined (the same floats, the same work records in the same
    order). ``ctx``: (now, the state's jobs, the estimates, the learner's seen works, its
    ``note``, the typical work)."""
    now, jobs, est, seen, note, typical = ctx
    t = slope = 0.0
    typ = False
    for j in residents:
        pl = asg.get(j)
        v = est.get(j)
        if pl is not None and v:
            s = v.get(pl.profile, 0.5)
        else:
            s = 1.0 if pl is None or pl.profile == full else 0.5
        s = 0.05 if s < 0.05 else s
        js = jobs.get(j)
        p = None if js is None else js.progress
        if p is None or js.status in CORE_ENDED:
            rem = typical()
            typ = True
        else:
            if j not in seen:  # as remaining() records it
                note(j, p[1])
            t0, work, rate = p  # JobState.remaining_work, then at least 1 s
            left = work - (rate * (now - t0) if rate > 0 else 0.0)
            rem = 1.0
            if left > 1.0:  # falls at rate / s until then (a rate <= 0 leaves slope)
                rem = left
                slope = max(slope, rate / s)
        x = rem / s
        if x > t:
            t = x
    return t, slope, typ


class WatchedDict(dict):  # type: ignore[type-arg]
    """A dict that reports every key written, removed or read with ``[]`` (a value read that
    way may be changed in place) to ``changed``; ``get`` reports nothing (readers)."""

    def __init__(self, changed: Callable[[Any], None], *args: Any) -> None:
        super().__init__(*args)
        self.changed = changed

    def __getitem__(self, key: Any) -> Any:
        self.changed(key)
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.changed(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self.changed(key)
        super().__delitem__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        self.changed(key)
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.changed(key)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kw: Any) -> None:
        new = dict(*args, **kw)
        for k in new:
            self.changed(k)
        super().update(new)

    def clear(self) -> None:
        for k in self:
            self.changed(k)
        super().clear()


class FreeTimes:
    """The soonest free GPUs of a :class:`ClusterState` (:meth:`soonest`), exactly as sorting
    every GPU's :func:`end_time` would give them. Jobs whose estimates changed are reported
    with :meth:`job_changed` (:class:`WatchedDict` does it)."""

    def __init__(self) -> None:
        self._state: ClusterState | None = None
        self._reset()

    def _reset(self) -> None:
        self._heaps: list[list[tuple[float, int, str]]] = [[] for _ in SLOPES]
        self._ver: dict[str, int] = {}
        self._steep: set[str] = set()
        self._typical: set[str] = set()   # GPUs whose time used the typical work
        self._typ: float | None = None
        self._dirty: set[str] = set()
        self._jobs: set[str] = set()
        self._order: dict[str, int] = {}
        self._reorder = True

    def job_changed(self, j: str) -> None:
        """``j``'s estimate or progress changed: its GPU is re-evaluated at the next ask."""
        self._jobs.add(j)

    def _gpu_changed(self, g: str) -> None:
        self._dirty.add(g)
        st = self._state
        if st is not None and g not in st.gpus:
            self._order.pop(g, None)
        elif g not in self._order:
            self._reorder = True

    def _bind(self, st: ClusterState) -> None:
        self._reset()
        self._state = st
        self._dirty = set(st.gpus)
        st.watch(self._gpu_changed)
        st.watch_progress(self.job_changed)

    def _push(self, g: str, got: Timed, now: float) -> None:
        v, slope, typ = got
        ver = self._ver[g] = self._ver.get(g, 0) + 1
        (self._typical.add if typ else self._typical.discard)(g)
        if slope > SLOPES[-1]:
            self._steep.add(g)
            return
        self._steep.discard(g)
        i = next(i for i, c in enumerate(SLOPES) if slope <= c)
        heapq.heappush(self._heaps[i], (v + SLOPES[i] * now, ver, g))

    def _refresh(self, st: ClusterState, typical: float,
                 evaluate: Callable[[str], Timed]) -> None:
        if self._typ != typical:
            self._typ = typical
            self._dirty |= self._typical
        for j in self._jobs:
            js = st.jobs.get(j)
            if js is not None and js.gpu is not None:
                self._dirty.add(js.gpu)
        self._jobs.clear()
        if self._reorder:
            self._order = {g: i for i, g in enumerate(st.gpus)}
            self._reorder = False
        for g in self._dirty:
            if g in st.gpus:
                self._push(g, evaluate(g), st.now)
            elif g in self._ver:  # gone: its entries are stale
                self._ver[g] += 1
                self._steep.discard(g)
                self._typical.discard(g)
        self._dirty.clear()
        if sum(map(len, self._heaps)) > 4 * len(st.gpus) + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop superseded heap entries."""
        self._heaps = [[e for e in h if e[1] == self._ver[e[2]]] for h in self._heaps]
        for h in self._heaps:
            heapq.heapify(h)

    def _bound(self, now: float) -> tuple[float, int] | None:
        """(lower bound on any time left in the heaps, the heap holding it)."""
        best: tuple[float, int] | None = None
        for i, h in enumerate(self._heaps):
            while h and h[0][1] != self._ver[h[0][2]]:
                heapq.heappop(h)
            if h:
                key = h[0][0]
                b = key - SLOPES[i] * now
                b -= 1e-9 * (abs(key) + SLOPES[i] * now) + 1e-6  # float rounding
                if best is None or b < best[0]:
                    best = (b, i)
        return best

    def soonest(self, st: ClusterState, m: int, typical: float,
                evaluate: Callable[[str], Timed]) -> list[tuple[float, str]]:
        """The ``m`` GPUs soonest free (all of them when fewer), soonest first, each with
        its :func:`end_time` now (``evaluate(g)``: it, with ``typical`` the typical work);
        ties in ``st.gpus``'s order."""
        if st is not self._state:
            self._bind(st)
        now = st.now
        self._refresh(st, typical, evaluate)
        order = self._order
        done = [(g, evaluate(g)) for g in self._steep]
        best: list[tuple[float, int]] = []  # the m smallest (negated), a max-heap
        for g, got in done:
            _keep(best, m, got[0], order[g])
        while True:
            b = self._bound(now)
            if b is None or (len(best) >= m and -best[0][0] < b[0]):
                break
            _, _, g = heapq.heappop(self._heaps[b[1]])
            got = evaluate(g)
            done.append((g, got))
            _keep(best, m, got[0], order[g])
        for g, got in done:
            self._push(g, got, now)
        out = sorted((t, order[g], g) for g, (t, _, _) in done)[:m]
        return [(t, g) for t, _, g in out]


def _keep(best: list[tuple[float, int]], m: int, t: float, o: int) -> None:
    """Keep the ``m`` smallest (t, o) in the max-heap ``best`` (negated)."""
    if len(best) < m:
        heapq.heappush(best, (-t, -o))
    elif (t, o) < (-best[0][0], -best[0][1]):
        heapq.heapreplace(best, (-t, -o))


def brute_soonest(gpus: Iterable[str], m: int, evaluate: Callable[[str], Timed]
                  ) -> list[tuple[float, str]]:
    """:meth:`FreeTimes.soonest` by evaluating every GPU (tests compare the two)."""
    times = [(evaluate(g)[0], i, g) for i, g in enumerate(gpus)]
    return [(t, g) for t, _, g in sorted(times)[:m]]
