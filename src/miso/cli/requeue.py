"""``miso requeue JOB``: run an ended job (failed, cancelled, or finished) again as a new job
with the same command, environment, directory, memory and name (a failed or cancelled job's
name is free again; a finished one's gets a ``-2``, ``-3``... suffix). The new job starts
from the beginning: its checkpoints are its own (a program that wants the old job's state
reads it from its own files)."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any

import typer

from miso.cli.text import fail
from miso.jobstatus import TERMINAL


def requeue(
    job: Annotated[str, typer.Argument(help="Job id or name of an ended job.")],
    name: Annotated[str | None, typer.Option(
        "--name", help="Name of the new job.  [default: the old job's]")] = None,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"id", "from"} JSON.')]
    = False,
    url: Annotated[str | None, typer.Option("--url", help="API URL of the cluster.")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", help="API token (prefer --token-file or $MISO_TOKEN).")] = None,
    token_file: Annotated[str | None, typer.Option(
        "--token-file", help="Read the API token from this file.")] = None,
    state_dir: Annotated[str | None, typer.Option(
        "--state-dir", help="Local cluster state directory.")] = None,
) -> None:
    """Submit an ended job again (same command, environment, directory and memory)."""
    from miso.cli.client import call, client

    with client(url, token, state_dir, None, token_file) as c:
        old: dict[str, Any] = call(c.job, job)
        if old.get("state") not in TERMINAL:
            fail(f"job {old.get('id')} is {old.get('state')}: only an ended job is requeued "
                 "(cancel it first)")
        new_name = name or str(old.get("name") or "")
        if name is None and old.get("state") == "finished":
            taken = {j.get("name") for j in call(c.jobs)}
            k = 2
            while f"{new_name}-{k}" in taken:
                k += 1
            new_name = f"{new_name}-{k}"
        env = dict(old.get("env") or {})
        jid = call(c.submit, list(old["command"]), name=new_name or None,
                   memory_gb=old.get("memory_gb"), workload=old.get("workload"), env=env,
                   cwd=old.get("cwd"), request_id=uuid.uuid4().hex,
                   **({"profile": old["profile"]} if old.get("profile") else {}))
    typer.echo(json.dumps({"id": jid, "from": old["id"]}) if json_out
               else f"{jid} (requeued {old['id']} as {new_name})")
