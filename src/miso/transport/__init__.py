"""How the controller reaches agents (controller <-> agent calls), in one place.

* :mod:`miso.transport.base`: the :class:`Transport` protocol and :class:`NodeUnavailable`.
* :mod:`miso.transport.inprocess`: agents in this process (``LocalTransport``) and the
  one-process emulated cluster built on it (``LocalCluster``: tests, ``miso demo --no-ray``).
* :mod:`miso.transport.ray`: agents as Ray actors: ``RayTransport`` (the controller's side),
  the agent and controller actors (the other side).
* :mod:`miso.transport.raystart`: starting, finding, checkpointing and stopping those actors
  in a running Ray. Starting and stopping a Ray head itself is :mod:`miso.raycluster`.

Only :mod:`miso.transport.ray` and :mod:`miso.transport.raystart` use ray, and import it only
when called.
"""

from miso.transport.base import NodeUnavailable, Transport

__all__ = ["NodeUnavailable", "Transport"]
