"""Occupancy index: a policy's view of the GPUs grouped into classes, each class in GPU order.

Placement policies ask "the first GPU, in GPU order, whose resident mix admits this job";
scanning every GPU per arrival makes each event cost O(GPUs). An :class:`Occupancy` keeps every
GPU in the class its policy's ``key`` gives it (e.g. the resident count and the memory
signatures of the residents) and each class's GPUs sorted by the order they were added, so a
query looks at classes, not GPUs. It stays current from the :class:`ClusterState`'s change hook
(:meth:`ClusterState.watch`) and from the decisions of the current ``decide`` call that the
state does not show yet (the scratch's ``touched`` GPUs). A key never sees anything but the GPU
it is computed for, so only changed GPUs are re-keyed: a few per event.

``tags`` optionally labels each class (computed once per class): :meth:`first` and
:meth:`ordered` then look only at the classes carrying a tag, e.g. "admits a job of this memory
signature with n residents".
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from miso.sched.state import ClusterState


class View(Protocol):
    """What the index reads from a ``decide`` call's scratch."""

    state: ClusterState
    touched: list[str]


V = TypeVar("V", bound=View)
Tags = Callable[[Hashable], Iterable[Hashable]]


class Occupancy(Generic[V]):
    """GPUs grouped by ``key(view, gpu)`` (``None``: in no class), each class in GPU order."""

    def __init__(self, key: Callable[[V, str], Hashable | None], tags: Tags | None = None
                 ) -> None:
        self.key = key
        self.tags = tags
        self._state: ClusterState | None = None
        self._view: V | None = None
        self._seen = 0                                  # view.touched entries processed
        self._dirty: set[str] = set()
        self._rank: dict[str, int] = {}                 # gpu -> position in GPU order
        self._gpu_at: dict[int, str] = {}
        self._next = 0
        self._cls: dict[str, Hashable] = {}             # gpu -> its class
        self._members: dict[Hashable, list[int]] = {}   # class -> sorted ranks (non-empty)
        self._tags_of: dict[Hashable, tuple[Hashable, ...]] = {}
        self._tagged: dict[Hashable, set[Hashable]] = {}  # tag -> non-empty classes

    # -- upkeep ---------------------------------------------------------------------------
    def view(self, v: V) -> Occupancy[V]:
        """Bring the index up to date for ``v`` (call before every query; cheap)."""
        if v.state is not self._state:
            self._bind(v.state)
        if v is not self._view:
            self._view = v
            self._seen = 0
            for g in self._dirty:
                self._rekey(v, g)
            self._dirty.clear()
        touched = v.touched
        while self._seen < len(touched):
            g = touched[self._seen]
            self._seen += 1
            self._rekey(v, g)
            self._dirty.add(g)  # the next call re-keys it from the state as applied
        return self

    def refresh(self, v: V, g: str) -> None:
        """Re-key ``g`` now: its key changed through something the index cannot see (the
        policy's own bookkeeping during the call)."""
        self.view(v)
        self._rekey(v, g)
        self._dirty.add(g)

    def _bind(self, st: ClusterState) -> None:
        self._view = None
        self._dirty.clear()
        self._rank.clear()
        self._gpu_at.clear()
        self._cls.clear()
        self._members.clear()
        self._tagged.clear()
        self._state = st
        st.watch(self._note)
        for g in st.gpus:
            self._note(g)

    def _note(self, g: str) -> None:
        """The state's change hook: rank new GPUs in the order they are added, forget removed
        ones at once (an id may come back, last in GPU order), re-key the rest lazily."""
        assert self._state is not None
        if g in self._state.gpus:
            if g not in self._rank:
                self._rank[g] = self._next
                self._gpu_at[self._next] = g
                self._next += 1
            self._dirty.add(g)
        else:
            self._dirty.discard(g)
            old = self._cls.pop(g, None)
            r = self._rank.pop(g, None)
            if r is not None:
                del self._gpu_at[r]
                if old is not None:
                    self._remove(old, r)

    def _rekey(self, v: V, g: str) -> None:
        r = self._rank.get(g)
        if r is None:  # not (or no longer) a GPU of the state
            return
        new = self.key(v, g)
        old = self._cls.get(g)
        if new == old:
            return
        if old is not None:
            self._remove(old, r)
            del self._cls[g]
        if new is not None:
            self._add(new, r)
            self._cls[g] = new

    def _add(self, cls: Hashable, r: int) -> None:
        m = self._members.get(cls)
        if m is None:
            self._members[cls] = [r]
            for t in self._class_tags(cls):
                self._tagged.setdefault(t, set()).add(cls)
        else:
            insort(m, r)

    def _remove(self, cls: Hashable, r: int) -> None:
        m = self._members[cls]
        del m[bisect_left(m, r)]
        if not m:
            del self._members[cls]
            for t in self._class_tags(cls):
                s = self._tagged[t]
                s.discard(cls)
                if not s:
                    del self._tagged[t]

    def _class_tags(self, cls: Hashable) -> tuple[Hashable, ...]:
        if self.tags is None:
            return ()
        got = self._tags_of.get(cls)
        if got is None:
            got = self._tags_of[cls] = tuple(self.tags(cls))
        return got

    # -- queries --------------------------------------------------------------------------
    def rank(self, g: str) -> int:
        """``g``'s position in GPU order (the order GPUs were added)."""
        return self._rank[g]

    def any(self) -> bool:
        """Some GPU is in a class."""
        return bool(self._members)

    def classes(self) -> Iterator[tuple[Hashable, str]]:
        """Every non-empty class with its first GPU (in GPU order)."""
        at = self._gpu_at
        return ((c, at[m[0]]) for c, m in self._members.items())

    def members(self, cls: Hashable, limit: int | None = None) -> list[str]:
        """The GPUs of class ``cls`` in GPU order (the first ``limit``)."""
        m = self._members.get(cls, [])
        at = self._gpu_at
        return [at[r] for r in (m if limit is None else m[:limit])]

    def _lists(self, tags: Iterable[Hashable], admit: Callable[[Hashable], bool] | None
               ) -> list[list[int]]:
        out = []
        for t in tags:
            for c in self._tagged.get(t, ()):
                if admit is None or admit(c):
                    out.append(self._members[c])
        return out

    def first(self, tags: Iterable[Hashable], admit: Callable[[Hashable], bool] | None = None
              ) -> str | None:
        """The first GPU, in GPU order, of the classes carrying one of ``tags`` (and passing
        ``admit``, when given)."""
        lists = self._lists(tags, admit)
        if not lists:
            return None
        return self._gpu_at[min(m[0] for m in lists)]

    def ordered(self, tags: Iterable[Hashable], admit: Callable[[Hashable], bool] | None = None
                ) -> Iterator[str]:
        """The GPUs of those classes in GPU order. Lazy: consume it before the scratch changes
        (the next placement or requeue)."""
        lists = self._lists(tags, admit)
        at = self._gpu_at
        if len(lists) == 1:
            return (at[r] for r in lists[0])
        return (at[r] for r in heapq.merge(*lists))
