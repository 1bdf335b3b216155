"""The cheapest covering of a service's target rate by replicas (pure, no I/O).

Given the profiles a service can run on with their capacities at its SLO and compute slices
(``options``), the multiset of profiles with the fewest compute slices, then the fewest
replicas, whose capacities sum to at least ``need``, with a replica count in
[``at_least``, ``at_most``]. Exact: a branch-and-bound over the counts per profile.
"""

from __future__ import annotations

from collections.abc import Sequence


def cheapest_covering(options: Sequence[tuple[str, float, int]], need: float, at_least: int,
                      at_most: int) -> list[str] | None:
    """Profiles (names, repeated) of the cheapest covering; None if no count covers ``need``.
    ``options``: (profile, capacity req/s, compute slices), smallest first."""
    opts = list(options)
    if not opts:
        return None
    best: tuple[int, int, list[str]] | None = None
    # a covering uses at most need / smallest-capacity + 1 replicas; bound the search
    k_max = min(at_most, max(at_least, 1) + 64)

    def rec(i: int, left: float, count: int, slices: int, chosen: list[str]) -> None:
        nonlocal best
        if best is not None and (slices, count) >= best[:2]:
            return
        if left <= 1e-9 and count >= at_least:
            best = (slices, count, list(chosen))
            return
        if count >= k_max or i >= len(opts):
            return
        name, c, g = opts[i]
        # take this profile once more (stay at i), or move on to the next one
        chosen.append(name)
        rec(i, left - c, count + 1, slices + g, chosen)
        chosen.pop()
        rec(i + 1, left, count, slices, chosen)

    rec(0, need, 0, 0, [])
    return best[2] if best else None
