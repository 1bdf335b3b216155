"""The address other hosts reach this node at, for a gang's rendezvous (``MASTER_ADDR``).

A gang's ranks meet at rank 0's node. On an emulated cluster every agent is on one host
(127.0.0.1); on several hosts the operator names each node's address in ``MISO_NODE_ADDR``
(an IP address or a host name) where the agent starts, and the Ray transport takes the Ray
node's IP when it is not set. The value goes into every rank's environment, so it is checked
(an address or a DNS name, nothing else).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket

#: The environment variable an operator sets on a node (read by its agent)
ENV = "MISO_NODE_ADDR"
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                   r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def valid_addr(addr: object) -> str | None:
    """``addr`` when it is an IP address or a DNS host name, else None."""
    if not isinstance(addr, str) or not addr:
        return None
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        return addr if _HOST.match(addr) else None


def node_addr() -> str | None:
    """This node's rendezvous address from ``MISO_NODE_ADDR`` (None when unset or invalid)."""
    return valid_addr(os.environ.get(ENV))


def free_port() -> int:
    """A TCP port free on every address of this host now (a gang's rendezvous port when rank
    0 runs here: ``MASTER_PORT`` must be free on rank 0's node, not on the controller's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
