"""``miso user add|list|remove|rotate``: the users of a cluster and their tokens.

Through the API with an admin token; or, before the cluster has any user, directly in the
state directory by the local operator on the head (the first user, an admin). A token is
printed once, alone on stdout (``TOKEN=$(miso user add alice)``); only its hash is kept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from miso.cli.client import (
    StateDir,
    Token,
    TokenFile,
    Url,
    call,
    client,
    default_state_dir,
    explicit_token,
)
from miso.cli.group import QuickHelpGroup
from miso.cli.text import fail, make_console

if TYPE_CHECKING:
    from miso.api.users import UserStore

user_app = typer.Typer(help="Users of the cluster and their API tokens.",
                       no_args_is_help=True, cls=QuickHelpGroup)
console = make_console()
USERS_DB = "users.db"


def _bootstrap_store(state_dir: str | None) -> UserStore | None:
    """The state dir's user store when this process may act as the local operator (the
    state directory is readable here and has no user yet), else None."""
    sd = Path(state_dir or os.environ.get("MISO_STATE_DIR") or default_state_dir())
    db = sd / USERS_DB
    if db.exists() and not os.access(db, os.R_OK | os.W_OK):
        return None
    if not db.exists() and sd.exists() and not os.access(sd, os.W_OK):
        return None
    from miso.api.users import UserStore

    store = UserStore(db)
    if store.count() == 0:
        return store
    store.close()
    return None


def _cluster_configured(url: str | None, token: str | None, state_dir: str | None) -> bool:
    """Whether the connection settings of every client command (flags, ``MISO_URL``/
    ``MISO_TOKEN``, a state dir's ``api.json``, ``miso login``) name a cluster: then users are
    added through its API, never into a local database."""
    from miso.api.credentials import resolve

    creds = resolve(url=url, token=token, state_dir=state_dir,
                    default_state_dir=default_state_dir())
    return bool(creds.url or creds.token)


@user_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="User name.")],
    admin: Annotated[bool, typer.Option("--admin", help="May manage users and see every "
                                        "job.")] = False,
    unix_user: Annotated[str | None, typer.Option(
        "--unix-user", help="Unix account (name or uid) the user's jobs run as when the "
        "agent runs as root; it must exist and must not be root (uid 0).")] = None,
    json_out: Annotated[bool, typer.Option(
        "--json", help='Print {"name", "admin", "token"} JSON.')] = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Add a user (admin only; the first user, an admin, by the local operator). Prints the
    token once."""
    from miso.api.users import UserError

    token = explicit_token(token, token_file)
    store = None if _cluster_configured(url, token, state_dir) else _bootstrap_store(state_dir)
    if store is not None:
        try:
            if not admin:
                fail("the cluster has no user yet: the first user must be an admin (--admin)")
            new = store.add(name, admin=True, unix_user=unix_user)
            store.record("local-operator", "user-add", None,
                         {"name": name, "admin": True, "unix_user": unix_user})
        except UserError as e:
            fail(str(e))
        finally:
            store.close()
        typer.echo(f"no cluster configured (--url, MISO_URL, `miso login`, a state dir's "
                   f"api.json): {name} added to {store.path}", err=True)
    else:
        with client(url, token, state_dir) as c:  # token: --token/--token-file, read above
            new = call(c.add_user, name, admin=admin, unix_user=unix_user)["token"]
    typer.echo(f"user {name} added{' (admin)' if admin else ''}; its token is printed once:",
               err=True)
    typer.echo(json.dumps({"name": name, "admin": admin or store is not None, "token": new})
               if json_out else new)


@user_app.command("list")
def list_users(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """List the users (admin only)."""
    with client(url, token, state_dir, token_file=token_file) as c:
        users = call(c.users)
    if json_out:
        typer.echo(json.dumps(users, indent=2))
        return
    t = Table(title="Users")
    for col in ("name", "id", "admin", "unix user"):
        t.add_column(col)
    for u in users:
        t.add_row(u["name"], u.get("id") or "-", "yes" if u["admin"] else "",
                  u.get("unix_user") or "-")
    console.print(t)


@user_app.command("remove")
def remove(
    name: Annotated[str, typer.Argument(help="User name.")],
    json_out: Annotated[bool, typer.Option("--json", help='Print {"removed"} JSON.')]
    = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Remove a user (admin only); its token stops working at once."""
    with client(url, token, state_dir, token_file=token_file) as c:
        call(c.remove_user, name)
    typer.echo(json.dumps({"removed": name}) if json_out else f"user {name} removed")


@user_app.command("rotate")
def rotate(
    name: Annotated[str, typer.Argument(help="User name (admins: anyone; others: "
                                        "themselves).")],
    json_out: Annotated[bool, typer.Option("--json", help='Print {"name", "token"} JSON.')]
    = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Give a user a new token (the old one stops working). Prints it once; a rotated token
    of your own is also updated where this CLI found it (login config, operator token)."""
    from miso.api.credentials import (
        OPERATOR_TOKEN,
        config_path,
        from_config,
        save_login,
        write_private,
    )

    with client(url, token, state_dir, token_file=token_file) as c:
        new = call(c.rotate, name)
    cfg = from_config()
    if cfg.url == c.url and cfg.token == c.token:
        save_login(c.url, new, cfg.ca)
        typer.echo(f"updated {config_path()}", err=True)
    sd = Path(state_dir or os.environ.get("MISO_STATE_DIR") or default_state_dir())
    op = sd / OPERATOR_TOKEN
    if op.exists() and os.access(op, os.W_OK) and op.read_text().strip() == c.token:
        write_private(op, new + "\n")
        typer.echo(f"updated {op}", err=True)
    typer.echo(f"new token of {name}, printed once:", err=True)
    typer.echo(json.dumps({"name": name, "token": new}) if json_out else new)
