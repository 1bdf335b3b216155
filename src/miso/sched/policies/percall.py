"""One answer per decision: a policy's stateful predicate (:meth:`Burst.burst
<miso.sched.policies.burst.Burst.burst>`) asked several times while one ``decide`` call runs
is computed once. Pure bookkeeping, no I/O."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any


def once_per_decision(inputs: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Cache a method without arguments under the key its object's method ``inputs`` returns
    (the decision it belongs to and every input that may change while the decision runs).
    Exact for a predicate whose repeated call on unchanged inputs gives its last answer (a
    hysteresis that has settled): then the cached answer is what a recomputation would
    give."""

    def deco(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        slot = f"_once_{fn.__name__}"

        @wraps(fn)
        def cached(self: Any) -> Any:
            key = getattr(self, inputs)()
            d = self.__dict__
            got = d.get(slot)
            if got is not None and got[0] == key:
                return got[1]
            out = fn(self)
            d[slot] = (key, out)
            return out

        return cached

    return deco
