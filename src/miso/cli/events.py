"""``miso events``: print the decision log (why each placement, profiling run and layout was
chosen). Registered by :mod:`miso.cli` as ``app.command("events")(events)``.

Where from: ``--file`` (e.g. what ``miso simulate --events`` wrote); else the running cluster's
API (``GET /api/v1/events``, found and authenticated like ``miso status``: each user sees the
decisions about their own jobs); else, when no API answers (e.g. after ``cluster down``), the
state directory's ``decisions.jsonl``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from miso.cli import checks
from miso.cli.text import fail


def _log_path(file: Path | None, state_dir: str | None) -> Path:
    from miso.observe import LOG_NAME

    if file is not None:
        return file
    d = Path(state_dir or os.environ.get("MISO_STATE_DIR")
             or Path.home() / ".miso" / "cluster").expanduser()
    return d / LOG_NAME


def events(
    job: Annotated[str | None, typer.Option("--job", help="Only decisions about this job.")]
    = None,
    gpu_id: Annotated[str | None, typer.Option(
        "--gpu-id", help="Only decisions on this GPU (its id: node0/1, gpu3).")] = None,
    since: Annotated[float | None, typer.Option(
        "--since", help="Only decisions at or after T seconds (the controller's or the "
        "simulation's clock, as printed).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1,
                                              help="Only the last N matching decisions.")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"events": [...]} JSON.')]
    = False,
    file: Annotated[Path | None, typer.Option(
        "--file", help="Read this log (e.g. written by `miso simulate --events FILE`) instead "
        "of the cluster's.")] = None,
    state_dir: Annotated[str | None, typer.Option(
        "--state-dir", help="Cluster state directory (default $MISO_STATE_DIR or "
        "~/.miso/cluster).")] = None,
    policy: Annotated[str | None, typer.Option(
        "--policy", help="With a simulator log of several policies: only this one.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", hidden=True,
                                            help="Old spelling of --gpu-id.")] = None,
    url: Annotated[str | None, typer.Option(
        "--url", help="API URL of the cluster (default $MISO_URL, the state dir or `miso "
        "login`).")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", help="API token. Visible to every local account in the process list: "
        "prefer --token-file or $MISO_TOKEN.")] = None,
    token_file: Annotated[str | None, typer.Option(
        "--token-file", help="Read the API token from this file (keep it 0600); or set "
        "$MISO_TOKEN.")] = None,
) -> None:
    """Print the decision log: every decision of the scheduler with its reason (trigger,
    predicted speeds, chosen layout and its objective vs the current one, restarts, gain)."""
    import math

    from miso.observe import read_records

    if since is not None and not math.isfinite(since):
        fail(f"--since must be a number of seconds, got {since}")
    gpu = checks.alias(gpu_id, gpu, "--gpu-id", "--gpu")
    from miso.cli.client import explicit_token

    tok = explicit_token(token, token_file)
    if url is not None and not url.startswith(("http://", "https://")):
        fail(f"--url {url}: expected http://HOST:PORT or https://HOST:PORT")
    recs = None if file is not None else _from_api(state_dir, job, gpu, since, url, tok)
    if recs is None and file is None and (url is not None or tok is not None):
        fail(f"no API answers at {url or 'the cluster'}: is the cluster running?")
    if recs is not None:
        _print(recs, policy, limit, json_out)
        return
    path = _log_path(file, state_dir)
    if not path.exists():
        where = f"{path}" if file is not None else \
            f"{path} (is a cluster running with this --state-dir?)"
        fail(f"no decision log at {where}")
    try:
        recs = read_records(path, job=job, gpu=gpu, since=since)
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {path}: {e}")
    except ValueError as e:  # miso.observe.eventlog.LogError: not a decision log
        fail(str(e))
    _print(recs, policy, limit, json_out)


def _from_api(state_dir: str | None, job: str | None, gpu: str | None,
              since: float | None, url: str | None = None,
              token: str | None = None) -> list[dict] | None:
    """The records from the cluster's API, or None when no API with a token answers."""
    from miso.api.client import ApiError, Client
    from miso.api.credentials import resolve

    c = resolve(url=url, token=token, state_dir=state_dir,
                default_state_dir=Path.home() / ".miso" / "cluster")
    if not c.url or not c.token:
        return None
    params = {k: v for k, v in (("job", job), ("gpu", gpu), ("since", since),
                                ("limit", 10000)) if v is not None}
    try:
        with Client(c.url, c.token, ca=c.ca, timeout=10) as cl:
            body = cl.request("GET", "/events", params=params)
    except ApiError as e:
        if e.status == 0:
            return None  # nothing listens there (the cluster is down): read the file
        fail(f"the API at {c.url} refused: {e.message}")
    recs = body.get("events") if isinstance(body, dict) else None
    return [{k: v for k, v in r.items() if k != "text"} for r in recs or []]


def _print(recs: list[dict], policy: str | None, limit: int | None, json_out: bool) -> None:
    from miso.observe.decisionwords import describe

    if policy is not None:
        recs = [r for r in recs if r.get("policy") == policy]
    if limit:
        recs = recs[-limit:]
    if json_out:
        typer.echo(json.dumps({"events": recs}))
        return
    if not recs:
        typer.echo("no matching decisions", err=True)
        return
    last_policy = None
    for r in recs:
        if r.get("policy") and r.get("policy") != last_policy:
            last_policy = r["policy"]
            typer.echo(f"== policy {last_policy}")
        typer.echo(describe(r))
