"""The API as the cluster head serves it, next to the controller (in its process).

* ``<state>/users.db`` holds the users (0600), copied to ``users.db.bak`` at every start; a
  state directory whose job store holds jobs of users refuses to start without a readable
  ``users.db`` (:func:`users_problem`: a fresh one would forget who owns them);
* ``<state>/api.json`` says where the API listens (written on every start; a restarted
  controller listens on the same port again when it can);
* :func:`bootstrap_operator` makes the local operator the first admin of a cluster without
  users and keeps its token in ``<state>/operator.token`` (0600), so a single local user needs
  no set-up.
"""

from __future__ import annotations

import getpass
import json
import logging
import re
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from miso.api.app import create_app
from miso.api.credentials import API_FILE, OPERATOR_TOKEN, write_private
from miso.api.server import ApiServer, Listen, ListenError
from miso.api.users import ID_PREFIX, UserStore

USERS_DB = "users.db"
USERS_BACKUP = "users.db.bak"
#: Owner of a job whose user was removed before users had ids (no user ever has it).
GONE_PREFIX = "gone:"
log = logging.getLogger(__name__)


def users_of(state_dir: str | Path) -> UserStore:
    return UserStore(Path(state_dir) / USERS_DB)


def _jobs_with_owners(state_dir: Path) -> int:
    """Jobs of API users in the state dir's job store (0 when there is none or unreadable:
    the job store's own check reports that)."""
    db = state_dir / "miso.db"
    if not db.exists() or db.stat().st_size == 0:
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return int(con.execute("SELECT count(*) FROM jobs WHERE owner IS NOT NULL")
                       .fetchone()[0])
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return 0


def users_problem(state_dir: str | Path) -> str | None:
    """What is wrong with ``users.db`` of a state dir whose jobs belong to users, and how to
    recover (one line); None when it is fine or not needed. Reads only."""
    sd = Path(state_dir)
    n = _jobs_with_owners(sd)
    if not n:
        return None
    db, bak = sd / USERS_DB, sd / USERS_BACKUP
    fix = (f"restore it from its backup (cp {bak} {db}) or move {sd} away to start afresh"
           if bak.exists() else f"restore it, or move {sd} away to start afresh")
    if not db.exists():
        return f"the user store {db} is missing but {n} jobs belong to its users; {fix}"
    if db.stat().st_size == 0:
        return f"the user store {db} is empty (truncated?) but {n} jobs belong to its users; " \
               f"{fix}"
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            users = int(con.execute("SELECT count(*) FROM users").fetchone()[0])
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        return f"{db}: not a readable user store ({e}); {fix}"
    if users == 0:
        return f"the user store {db} has no user but {n} jobs belong to users; {fix}"
    return None


def backup_users(state_dir: str | Path, users: UserStore) -> None:
    """Copy the user store to ``users.db.bak`` (kept 0600)."""
    try:
        users.backup(Path(state_dir) / USERS_BACKUP)
    except (OSError, sqlite3.Error) as e:
        log.warning("user store backup failed: %s", e)


def migrate_owners(store: Any, users: UserStore) -> int:
    """Give the jobs of an older store, owned by user *names*, to user *ids*; returns how
    many jobs changed. A name goes to the user of that name only when that user existed
    when the job was submitted (else it was re-created since: the job goes to
    ``gone:<name>``, which no user has). Idempotent: owners that are ids stay."""
    created = {u["name"]: (u["id"], float(u["created_at"])) for u in users.list()}
    moves: dict[tuple[str, str], list[str]] = {}
    for job, owner, submitted in store.owner_rows():
        if owner.startswith((ID_PREFIX, GONE_PREFIX)):
            continue
        uid, since = created.get(owner, (None, 0.0))
        new = uid if uid is not None and since <= submitted + 1e-6 else GONE_PREFIX + owner
        moves.setdefault((new, owner), []).append(job)
    for (new, name), jobs in moves.items():
        store.set_owner(jobs, new, name)
        log.warning("jobs of user %r moved to the user id %s: %s", name, new, ",".join(jobs))
    return sum(len(j) for j in moves.values())


def bootstrap_operator(state_dir: str | Path) -> str | None:
    """With no user yet: add this process's Unix user as an admin whose jobs run as that
    account, store its token for it in ``operator.token``; returns the name (else None)."""
    users = users_of(state_dir)
    try:
        if users.count():
            return None
        unix = getpass.getuser()
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", unix).lstrip("-._") or "operator"
        token = users.add(name, admin=True, unix_user=unix, operator=True)
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
    problem = users_problem(sd)
    if problem:
        raise ListenError(problem)
    users = users_of(sd)
    migrate_owners(controller.store, users)
    backup_users(sd, users)
    app = create_app(controller, users, extra_routers=extra_routers)
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
