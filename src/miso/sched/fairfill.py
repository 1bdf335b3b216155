"""Max-min fair shares of a capacity by weight, capped at demands (water-filling), in one
level or two (accounts, then the owners of each: Slurm's association tree). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.tenancyconfig import TenancyConfig


def water_fill(capacity: float, demand: Mapping[str, float],
               weight: Callable[[str], float]) -> dict[str, float]:
    """Max-min fair shares of ``capacity`` by ``weight`` capped at ``demand`` (every owner of
    ``demand``; the sum is ``min(capacity, total demand)``)."""
    out: dict[str, float] = {}
    left = dict(demand)
    cap = capacity
    while left:
        tot_w = sum(weight(o) for o in left)
        full = {o: d for o, d in left.items() if d <= cap * weight(o) / tot_w + 1e-12}
        if not full:
            for o in left:
                out[o] = cap * weight(o) / tot_w
            break
        for o, d in full.items():
            out[o] = d
            cap -= d
            del left[o]
    return out


def two_level_fill(capacity: float, demand: Mapping[str, float], config: TenancyConfig
                   ) -> dict[str, float]:
    """:func:`water_fill` between accounts (their demand: their owners' together; their
    ``account_weight``), then within each account between its owners (their ``weight``):
    Slurm's association tree with two levels. Without accounts: :func:`water_fill`."""
    if not config.accounts:
        return water_fill(capacity, demand, config.weight)
    members: dict[str, dict[str, float]] = {}
    for o, d in demand.items():
        members.setdefault(config.account_of(o), {})[o] = d
    got = water_fill(capacity, {a: sum(m.values()) for a, m in members.items()},
                     config.account_weight)
    out: dict[str, float] = {}
    for a, m in members.items():
        out.update(water_fill(got[a], m, config.weight))
    return out
