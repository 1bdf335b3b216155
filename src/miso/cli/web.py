"""``miso web``: the cluster's web page, signed in: prints (and with ``--open`` opens) the
page's address with your token in the URL fragment (``#token=...``), which the browser never
sends to the server; the page keeps it for its tab only and removes it from the address bar."""

from __future__ import annotations

import urllib.parse
from typing import Annotated

import typer


def web(
    open_browser: Annotated[bool, typer.Option(
        "--open", help="Open it in this machine's browser too.")] = False,
    url: Annotated[str | None, typer.Option("--url", help="API URL of the cluster.")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", help="API token (prefer --token-file or $MISO_TOKEN).")] = None,
    token_file: Annotated[str | None, typer.Option(
        "--token-file", help="Read the API token from this file.")] = None,
    state_dir: Annotated[str | None, typer.Option(
        "--state-dir", help="Local cluster state directory.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"url": ...} JSON.')]
    = False,
) -> None:
    """The web page's address with your token (in the #fragment: never sent to the server).
    Anyone who sees the printed address can use the token: do not paste it in shared places."""
    import json

    from miso.cli.client import client

    with client(url, token, state_dir, None, token_file) as c:
        base = str(c.url).rstrip("/")
        tok = str(c.token)
    page = f"{base}/#token={urllib.parse.quote(tok, safe='')}"
    typer.echo(json.dumps({"url": page}) if json_out else page)
    if open_browser:
        import webbrowser

        webbrowser.open(page)
