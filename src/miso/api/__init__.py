"""The authenticated HTTP API of a miso cluster: users and tokens, authorisation, the server.

See :mod:`miso.api.app` for the endpoints, :mod:`miso.api.users` for users and the audit
record, :mod:`miso.api.server` for serving it from the cluster head.
"""

from miso.api.app import API, create_app, require_admin, require_user
from miso.api.users import User, UserError, UserStore

__all__ = ["API", "User", "UserError", "UserStore", "create_app", "require_admin",
           "require_user"]
