"""Experiments kept out of the shipped profiles (issue 27): each is a plugin a benchmark puts
into a profile, e.g. ``make_policy("miso+", estimates=(MemoryPrior(),))`` or
``PROFILES["miso+"]`` with ``options={"estimates": ...}``. The shipped ``miso+`` runs none;
each was measured no better (benchmarks/README.md, "Predictor").

* :mod:`~miso.sched.experiments.speeds` (issue 19): ``RobustRisk``, ``MemoryPrior``,
  ``ClusterPriorPlugin`` (which speeds a plan uses), ``PropagateObserved``,
  ``AnchorSlices``, ``LearnEarlierSlices`` (what a measured slice teaches).
* :mod:`~miso.sched.experiments.restarts`: ``ToldRestartPrice`` (the configured restart price,
  never learned: ``restart_costs=ToldRestartPrice``).
"""

from miso.sched.experiments.restarts import ToldRestartPrice
from miso.sched.experiments.speeds import (
    AnchorSlices,
    ClusterPriorPlugin,
    LearnEarlierSlices,
    MemoryPrior,
    PropagateObserved,
    RobustRisk,
    earlier_slice_speeds,
)

__all__ = ["AnchorSlices", "ClusterPriorPlugin", "LearnEarlierSlices", "MemoryPrior",
           "PropagateObserved", "RobustRisk", "ToldRestartPrice", "earlier_slice_speeds"]
