"""A restart-price experiment kept out of the shipped ``miso+`` (issue 27): the price told and
never learned. ``make_policy("miso+", restart_costs=ToldRestartPrice)`` prices every restart
at the configured ``restart_s``; measured worse than learning when the told price is wrong
(benchmarks/history/noregret.md, "Restart cost measured, not told";
``tests/test_sim.py::test_misoplus__measured_restart_costs_replace_a_wrong_told_cost``)."""

from __future__ import annotations

from miso.sched.decisions import Decision
from miso.sched.policies.learners import RestartCosts
from miso.sched.state import ClusterState


class ToldRestartPrice(RestartCosts):
    """Every restart costs the configured ``prior_s``; no restart is measured (so ``seen``
    stays empty and rebalancing prices every donor at the shared price)."""

    def cost(self, job: str) -> float:
        return self.prior_s

    def note_plans(self, st: ClusterState, ran: set[str], now: float,
                   out: list[Decision]) -> None:
        """Nothing is measured: no restart is remembered."""
