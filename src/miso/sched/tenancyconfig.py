"""What an operator sets for tenancy (:class:`TenancyConfig`: fair share, weights, quotas,
preemption), priority classes, and the one-line refusal of a submission over a queued-jobs
quota. How the running cluster applies them (usage ledger, queue order, entitlements) is
:mod:`miso.sched.tenancy`. Pure: no I/O."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Named priority classes.
PRIORITY_CLASSES: dict[str, int] = {"high": 100, "normal": 0, "low": -100}
HIGH = PRIORITY_CLASSES["high"]
#: The largest fairness price an operator may state (1: the average JCT may double).
MAX_FAIRNESS_PRICE = 1.0


def parse_priority(value: str | int | float) -> int:
    """``high``/``normal``/``low`` or an integer (as text or number); ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"priority {value!r}: expected high, normal, low or an integer")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"priority {value!r}: expected an integer")
        return int(value)
    v = str(value).strip().lower()
    if v in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[v]
    # ASCII digits only: int() would also take "１" (a full-width digit) and "1_0"
    if not re.fullmatch(r"[+-]?[0-9]{1,15}", v):
        raise ValueError(f"priority {value!r}: expected high, normal, low or an integer")
    return int(v)


@dataclass(frozen=True)
class TenancyConfig:
    """What an operator sets. Owners not named get ``default_weight`` and no quota."""

    fair_share: bool = True
    half_life_s: float = 7 * 24 * 3600.0        # Slurm's default PriorityDecayHalfLife
    weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    max_in_use: Mapping[str, float] = field(default_factory=dict)   # GPU-equivalents
    max_queued: Mapping[str, int] = field(default_factory=dict)
    #: A job of at least ``preempt_priority`` that cannot be placed may preempt lower ones.
    preempt: bool = False
    preempt_priority: int = HIGH
    #: A job is never preempted before it has run this long since its last (re)start.
    min_run_s: float = 600.0
    #: A job that cannot checkpoint loses all its progress: never preempted unless this is set.
    preempt_uncheckpointable: bool = False
    #: With ``fair_share``: owners below their entitlement get fair slices, borrowed room is
    #: reclaimed (module docstring); False: fair share orders the queue only.
    reclaim: bool = True
    #: GPUs one active job counts towards its owner's demand (entitlements; an owner with
    #: jobs demands one GPU at least), so the most of a GPU a fair slice can be: 1 claims a
    #: whole GPU per job up to the owner's share; less leaves more room to the others.
    demand_per_job: float = 0.5
    #: An owner keeps its fair slices until it holds this many GPUs more than its entitlement
    #: (hysteresis: without it its jobs' slices shrink and grow back, a restart each time, as
    #: it crosses its entitlement).
    keep_margin: float = 1.0
    #: The share of the total average JCT the operator accepts to pay for fairness (0.05: 5 %);
    #: None: fair slices are capped at ``demand_per_job`` whatever the load. Set, the cap
    #: follows the cluster's backlog (:mod:`miso.sched.fairprice`): a whole GPU (what the
    #: owner gets alone on its share) when not backlogged, and a slice whose estimated price
    #: stays within this one when backlogged.
    fairness_price: float | None = None
    #: Accounts above owners (Slurm's association tree, two levels): owner -> its account.
    #: Fair share is between accounts first (``account_weights``, default
    #: ``default_weight``), then between the owners of one account (their ``weights``). An
    #: owner in no account is an account of its own with its own weight (one level: as
    #: without accounts).
    accounts: Mapping[str, str] = field(default_factory=dict)
    account_weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def entitled(self) -> bool:
        """Whether entitlements size slices and reclaim GPUs (fair share and reclaim)."""
        return self.fair_share and self.reclaim

    def __post_init__(self) -> None:
        if not self.keep_margin >= 0:
            raise ValueError(f"keep_margin must be >= 0, not {self.keep_margin}")
        if not 0 < self.demand_per_job <= 1:
            raise ValueError(f"demand_per_job must be in (0, 1], not {self.demand_per_job}")
        if self.fairness_price is not None and not (
                isinstance(self.fairness_price, int | float)
                and 0 <= self.fairness_price <= MAX_FAIRNESS_PRICE):
            raise ValueError(f"fairness_price must be a share from 0 to {MAX_FAIRNESS_PRICE:g}"
                             f", not {self.fairness_price!r}")
        if not self.half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, not {self.half_life_s}")
        for o, w in {**self.weights, "": self.default_weight}.items():
            if not w > 0:
                raise ValueError(f"weight of {o or 'an unnamed owner'} must be > 0, not {w}")
        for a, w in self.account_weights.items():
            if not w > 0:
                raise ValueError(f"weight of account {a} must be > 0, not {w}")

    def weight(self, owner: str) -> float:
        return float(self.weights.get(owner, self.default_weight))

    def account_of(self, owner: str) -> str:
        """The account ``owner`` is in: the named one, else ``user:<owner>`` (its own)."""
        a = self.accounts.get(owner)
        return f"account:{a}" if a is not None else f"user:{owner}"

    def account_weight(self, account: str) -> float:
        """The weight of an account as :meth:`account_of` names it (an owner's own account:
        the owner's weight)."""
        kind, _, name = account.partition(":")
        if kind == "user":
            return self.weight(name)
        return float(self.account_weights.get(name, self.default_weight))


def queued_quota_reason(owner: str, queued: int, cap: int | None) -> str | None:
    """The one-line refusal of a submission by ``owner`` with ``queued`` jobs queued against
    its queued-jobs quota ``cap`` (None: no quota), or None when it may submit."""
    if cap is None or queued < cap:
        return None
    return f"owner {owner or '(none)'} already has {queued} queued jobs (quota {cap})"
