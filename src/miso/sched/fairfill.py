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


def floored(demand: Mapping[str, float], held: Mapping[str, float],
            needs: Mapping[str, float]) -> dict[str, float]:
    """``demand`` raised, for each owner with jobs waiting (``needs``: their smallest slices
    together), to at least what it holds plus what they need: a waiting job is demand not
    met. Counted as ``demand_per_job`` a GPU per job, an account of a few jobs that need a 3g
    slice (3/7) each where fair slices are 2g (2/7) demanded less than it held: entitled to
    no more, its waiting jobs held no GPU and the other account's small jobs took every
    slice that freed (measured, accounts 2:1 at 3.25x, seed 2: B held 2.1-3.7 of its 5.3
    GPUs for 17,000 s with 1-9 of its 3g jobs waiting, A 70.1 % while both waited)."""
    return {o: max(d, held.get(o, 0.0) + needs[o]) if o in needs else d
            for o, d in demand.items()}


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
