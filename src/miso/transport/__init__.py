"""How the controller reaches agents (controller <-> agent calls), in one place.

* :mod:`miso.transport.base`: the :class:`Transport` protocol and :class:`NodeUnavailable`.
* :mod:`miso.transport.inprocess`: agents in this process (``LocalTransport``).
* :mod:`miso.transport.ray`: agents as named Ray actors: ``RayTransport`` (the controller's
  side) and the actors' names.

The transport imports only what is below it (the agent, the node protocol:
:mod:`miso.nodeerrors`, :mod:`miso.attemptstatus`, :mod:`miso.nodewire`). What puts agents,
a transport and a controller together (``LocalCluster``, the Ray actors) is
:mod:`miso.cluster`. Only :mod:`miso.transport.ray` uses ray, and imports it only when
called.
"""

from miso.transport.base import NodeUnavailable, Transport

__all__ = ["NodeUnavailable", "Transport"]
