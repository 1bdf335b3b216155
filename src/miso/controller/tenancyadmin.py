"""Owners' weights, quotas and accounts changed while the controller runs (an admin's
``miso quota``): kept in the store, and the tenancy they make handed to the scheduling loop,
which swaps it in between two events.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from miso.controller.quotas import Quota, QuotaStore, tenancy_config
from miso.controller.runtime import Runtime
from miso.sched import ClusterState
from miso.sched.tenancyconfig import TenancyConfig


class TenancyAdmin:
    """The controller's tenancy changes (see the module docstring). ``base`` is the tenancy
    the operator asked for (``--fair-share``), before the stored quotas; ``state`` the loop's;
    ``owner_names`` the controller's owner id -> user name."""

    def __init__(self, rt: Runtime, quotas: QuotaStore, state: ClusterState,
                 owner_names: dict[str, str], base: TenancyConfig | None) -> None:
        self.rt = rt
        self.quotas = quotas
        self.state = state
        self.owner_names = owner_names
        self.base = base
        self._lock = threading.Lock()

    def set_quota(self, owner: str, name: str, **fields: Any) -> Quota | None:
        """Set some of ``owner``'s weight and quotas (:data:`miso.controller.quotas.FIELDS`;
        None clears one) durably; the next scheduling decision uses them. ValueError on a
        value out of bounds. Returns the row (None when every field is back to its default)."""
        q = self.quotas.set(owner, name, **fields)
        self.owner_names[owner] = name
        self.retune()
        return None if q.empty else q

    def set_account(self, owner: str, name: str, account: str | None) -> None:
        """Put ``owner`` in ``account`` (None: none) durably; the next decision uses it."""
        self.quotas.set_account(owner, account)
        self.owner_names[owner] = name
        self.retune()

    def set_account_weight(self, account: str, weight: float | None) -> None:
        """Set ``account``'s weight (None: the default) durably; the next decision uses it."""
        self.quotas.set_account_weight(account, weight)
        self.retune()

    def clear_quota(self, owner: str) -> bool:
        """Forget ``owner``'s weight and quotas (defaults again)."""
        gone = self.quotas.clear(owner)
        self.retune()
        return gone

    def info(self) -> dict[str, Any]:
        """Whether tenancy is on and with which options (``quota show``)."""
        ten = self.rt.cfg.tenancy
        if ten is None:
            return {"on": False}
        return {"on": True, "fair_share": ten.fair_share, "half_life_s": ten.half_life_s,
                "preempt": ten.preempt, "min_run_s": ten.min_run_s,
                "default_weight": ten.default_weight, "fairness_price": ten.fairness_price,
                "live": self.state.tenancy is not None}

    def retune(self) -> None:
        """Give the loop the tenancy of the stored quotas (it swaps it in between two
        events). A cluster started without tenancy enforces the queued-jobs quota now and
        the rest from its next start."""
        with self._lock:  # read and hand over in one go: the last change wins
            cfg = tenancy_config(self.base, self.quotas.list(), self.quotas.accounts())
            if cfg is None and self.state.tenancy is not None:
                cfg = replace(self.state.tenancy.config, weights={}, max_in_use={},
                              max_queued={})
            self.rt.cfg = replace(self.rt.cfg, tenancy=cfg)
            if cfg is not None and self.state.tenancy is not None:
                self.rt.queue.put(("tenancy", cfg))
