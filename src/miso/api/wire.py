"""What the API's client and server agree on, importable without the server (no FastAPI).

The client (:mod:`miso.api.client`) needs only httpx and this module; the server
(:mod:`miso.api.app`) takes the same constants from here.
"""

from __future__ import annotations

#: The URL prefix of every endpoint.
API = "/api/v1"
#: Largest request body accepted (bytes).
MAX_BODY_BYTES = 1 << 20
