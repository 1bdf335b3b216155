"""Watching miso: Prometheus metrics, the decision log (why each layout was chosen), the live
web page and its JSON view. See ``docs/metrics.md`` and ``docs/observe.md``.

* :mod:`~miso.observe.observer` - the hooks a driver calls (``on_event``, ``on_decision``,
  ``on_timing``);
* :mod:`~miso.observe.metrics` - the Prometheus registry of one controller;
* :mod:`~miso.observe.decisions` - explanation records and their words (pure);
* :mod:`~miso.observe.eventlog` - the JSONL decision log;
* :mod:`~miso.observe.view` - the JSON the web page draws (pure);
* :mod:`~miso.observe.routes` - the FastAPI router (``/``, ``/metrics``, ``/api/v1/events``,
  ``/api/v1/cluster``).
"""

from miso.observe.eventlog import LOG_NAME, DecisionLog, read_records
from miso.observe.metrics import Metrics
from miso.observe.observer import Observer, attach, policy_estimates

__all__ = ["LOG_NAME", "DecisionLog", "Metrics", "Observer", "attach", "policy_estimates",
           "read_records"]
