"""The API as the cluster head serves it, next to the controller (in its process).

* ``<state>/users.db`` holds the users (0600);
* ``<state>/api.json`` says where the API listens (written on every start; a restarted
  controller listens on the same port again when it can);
* :func:`bootstrap_operator` makes the local operator the first admin of a cluster without
  users and keeps its token in ``<state>/operator.token`` (0600), so a single local user needs
  no set-up.
"""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from miso.api.app import create_app
from miso.api.credentials import API_FILE, OPERATOR_TOKEN, write_private
from miso.api.server import ApiServer, Listen, ListenError
from miso.api.users import UserStore

USERS_DB = "users.db"


def users_of(state_dir: str | Path) -> UserStore:
    return UserStore(Path(state_dir) / USERS_DB)


def bootstrap_operator(state_dir: str | Path) -> str | None:
    """With no user yet: add this process's Unix user as an admin whose jobs run as that
    account, store its token for it in ``operator.token``; returns the name (else None)."""
    users = users_of(state_dir)
    try:
        if users.count():
            return None
        unix = getpass.getuser()
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", unix).lstrip("-._") or "operator"
        token = users.add(name, admin=True, unix_user=unix)
        users.record("local-operator", "user-add", None,
                     {"name": name, "admin": True, "unix_user": unix, "bootstrap": True})
    finally:
        users.close()
    write_private(Path(state_dir) / OPERATOR_TOKEN, token + "\n")
    return name


def serve(controller: Any, state_dir: str | Path, listen: dict[str, Any] | None = None, *,
          extra_routers: Iterable[Any] = (), setup: Callable[[Any], None] | None = None
          ) -> ApiServer:
    """Start the API over ``controller`` and the state dir's users; records ``api.json``.
    ``setup(app)`` runs before serving (e.g. to add a middleware)."""
    sd = Path(state_dir)
    lst = Listen(**(listen or {}))
    app = create_app(controller, users_of(sd), extra_routers=extra_routers)
    if setup is not None:
        setup(app)
    srv = None
    if lst.port == 0:  # same port as before a restart, if it is free
        try:
            prev = json.loads((sd / API_FILE).read_text())
            if prev.get("host") == lst.host and prev.get("port"):
                srv = ApiServer(app, Listen(lst.host, int(prev["port"]), lst.tls_cert,
                                            lst.tls_key))
                srv.start()
        except (OSError, ValueError, ListenError):
            srv = None
    if srv is None:
        srv = ApiServer(app, lst)
        srv.start()
    app.state.api_url = srv.url
    port = int(srv.url.rsplit(":", 1)[1])
    write_private(sd / API_FILE, json.dumps({"url": srv.url, "host": lst.host, "port": port,
                                             "ca": lst.tls_cert}) + "\n")
    return srv
