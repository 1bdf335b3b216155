"""The authenticated HTTP API of a miso cluster: users and tokens, authorisation, the server.

See :mod:`miso.api.app` for the endpoints, :mod:`miso.api.users` for users and the audit
record, :mod:`miso.api.server` for serving it from the cluster head. The client side
(:mod:`miso.api.client`, :mod:`miso.api.credentials`, :mod:`miso.api.wire`) imports no server:
the names below are loaded on first use, so importing the client does not pull in FastAPI.
"""

from __future__ import annotations

import importlib
from typing import Any

from miso.api.wire import API

_LAZY = {"create_app": "miso.api.app", "require_admin": "miso.api.auth",
         "require_user": "miso.api.auth", "User": "miso.api.users",
         "UserError": "miso.api.users", "UserStore": "miso.api.users"}

__all__ = ["API", "User", "UserError", "UserStore", "create_app", "require_admin",
           "require_user"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
