"""What ``miso status --watch``, ``miso logs --follow``, ``miso cancel --all`` and ``miso
history`` do beyond one API call: repeat, follow, select by filter, and show finished jobs'
times. Registered through :mod:`miso.cli.client` (status, logs, cancel) and :mod:`miso.cli`
(``history``)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from miso.cli.text import fail
from miso.jobstatus import TERMINAL, JobStatus

if TYPE_CHECKING:
    from miso.api.client import Client


def watch(draw: Callable[[], None], interval: float, *, clear: Callable[[], None],
          sleep: Callable[[float], None] = time.sleep, count: int | None = None) -> None:
    """Call ``draw`` every ``interval`` s, the screen cleared first, until Ctrl-C (exit 0)
    or ``count`` times."""
    n = 0
    try:
        while True:
            clear()
            draw()
            n += 1
            if count is not None and n >= count:
                return
            sleep(interval)
    except KeyboardInterrupt:
        return


def follow_logs(c: Client, job: str, *, echo: Callable[[str], None], interval: float = 1.0,
                tail: int = 200, sleep: Callable[[float], None] = time.sleep,
                max_lines: int = 100_000) -> str:
    """Print a job's output as it grows (``tail`` lines first), until the job has ended;
    returns its final state. The API gives the last ``max_lines`` lines: each poll prints
    the lines after the ones already printed."""
    from miso.api.client import ApiError

    seen: list[str] = []
    first = True
    while True:
        try:
            state = str(c.job(job).get("state", ""))
            text = c.logs(job, max_lines)
        except ApiError as e:
            fail(e.message)
        lines = text.splitlines()
        new = _after(seen, lines)
        if first:
            new = new[-tail:]
            first = False
        for line in new:
            echo(line)
        seen = lines
        if state in TERMINAL:
            return state
        sleep(interval)


def _after(seen: list[str], lines: list[str]) -> list[str]:
    """The lines of ``lines`` that come after what ``seen`` showed (the window may have
    moved: the longest suffix of ``seen`` that starts ``lines`` is skipped)."""
    if not seen:
        return lines
    if lines[:len(seen)] == seen:
        return lines[len(seen):]
    for k in range(min(len(seen), len(lines)), 0, -1):
        if seen[-k:] == lines[:k]:
            return lines[k:]
    return lines


#: States ``cancel --state`` accepts (a job that has ended cannot be cancelled).
ACTIVE = (JobStatus.QUEUED, JobStatus.PROFILING, JobStatus.RUNNING, JobStatus.CHECKPOINTING)


def select_jobs(jobs: list[dict[str, Any]], *, states: list[str] | None = None,
                owner: str | None = None, since: float | None = None,
                name: str | None = None) -> list[dict[str, Any]]:
    """Jobs matching every filter given: state among ``states``, owner's name (or id),
    submitted at or after ``since`` (epoch seconds), name matching the glob ``name``."""
    import fnmatch

    out = []
    for j in jobs:
        if states and str(j.get("state")) not in states:
            continue
        if owner is not None and owner not in (j.get("owner_name"), j.get("owner")):
            continue
        if since is not None and float(j.get("submitted_at") or 0.0) < since:
            continue
        if name is not None and not fnmatch.fnmatchcase(str(j.get("name") or ""), name):
            continue
        out.append(j)
    return out


_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(v: str | None, now: float | None = None) -> float | None:
    """``--since``: a duration back from now (``90s``, ``30m``, ``2h``, ``1d``), a date
    (``2026-12-01`` or ``2026-12-01T14:00``, local time) or epoch seconds."""
    import datetime as dt

    if v is None:
        return None
    t = time.time() if now is None else now
    s = v.strip()
    m = _AGO.match(s)
    if m:
        return t - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return dt.datetime.fromisoformat(s).timestamp()
    except ValueError:
        pass
    try:
        x = float(s)
    except ValueError:
        fail(f"--since {v!r}: expected a duration (30m, 2h, 1d), a date (2026-12-01[T14:00]) "
             "or epoch seconds")
    if x != x or x < 0:
        fail(f"--since {v!r}: expected a time after 1970")
    return x


def job_times(j: dict[str, Any]) -> dict[str, float | None]:
    """A job's wait (submit to first start), JCT (submit to end) and end time, in seconds
    (None where it has not happened)."""
    sub, start, end = j.get("submitted_at"), j.get("started_at"), j.get("ended_at")
    wait = float(start) - float(sub) if start is not None and sub is not None else None
    jct = float(end) - float(sub) if end is not None and sub is not None else None
    return {"wait_s": wait, "jct_s": jct, "ended_at": float(end) if end is not None else None}


def _dur(x: float | None) -> str:
    if x is None:
        return "-"
    x = max(0.0, x)
    if x < 120:
        return f"{x:.0f}s"
    if x < 7200:
        return f"{x / 60:.0f}m"
    return f"{x / 3600:.1f}h"


def _when(x: float | None) -> str:
    return "-" if x is None else time.strftime("%m-%d %H:%M", time.localtime(x))


def history_table(jobs: list[dict[str, Any]], *, owners: bool) -> Table:
    """Finished (and other) jobs with their times, within 80 columns."""
    from miso.cli.text import safe

    t = Table(title="Job history")
    cols = ["id", "name", *(["owner"] if owners else []), "state", "submitted", "wait", "JCT",
            "ended"]
    for c in cols:
        t.add_column(c, overflow="ellipsis", no_wrap=True,
                     max_width=14 if c in ("name", "owner") else None)
    for j in jobs:
        tm = job_times(j)
        row = [j.get("id"), j.get("name"), *([j.get("owner_name") or j.get("owner") or "-"]
                                              if owners else []),
               j.get("state"), _when(j.get("submitted_at")), _dur(tm["wait_s"]),
               _dur(tm["jct_s"]), _when(tm["ended_at"])]
        t.add_row(*(safe(x if x is not None else "-") for x in row))
    return t


def history(
    state: Annotated[list[str] | None, typer.Option(
        "--state", help="Only jobs in this state (finished, failed, cancelled, queued, "
        "running...; repeatable).  [default: the ended ones]")] = None,
    owner: Annotated[str | None, typer.Option(
        "--owner", help="Only this user's jobs (admins; a user sees their own).")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only jobs submitted since: 30m, 2h, 1d, a date (2026-12-01) or "
        "epoch seconds.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="The latest N jobs at most.")]
    = 1000,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"jobs": [...]} JSON (each '
                                           "job with wait_s, jct_s, ended_at).")] = False,
    url: Annotated[str | None, typer.Option("--url", help="API URL of the cluster.")] = None,
    token: Annotated[str | None, typer.Option("--token", help="API token (prefer "
                                              "--token-file or $MISO_TOKEN).")] = None,
    token_file: Annotated[str | None, typer.Option(
        "--token-file", help="Read the API token from this file.")] = None,
    state_dir: Annotated[str | None, typer.Option(
        "--state-dir", help="Local cluster state directory.")] = None,
) -> None:
    """Your ended jobs with their wait, job completion time (JCT) and end time; filters
    --state, --owner, --since."""
    from miso.cli.client import call, client, console

    t0 = parse_since(since)
    states = list(state) if state else list(TERMINAL)
    with client(url, token, state_dir, None, token_file) as c:
        me = call(c.me)
        if owner is not None and not me.get("admin") and owner not in (me.get("name"),
                                                                       me.get("id")):
            fail("--owner: only admins see other users' jobs")
        jobs = call(c.jobs, limit=limit, all_users=bool(me.get("admin")))
    jobs = select_jobs(jobs, states=states, owner=owner, since=t0)
    jobs.sort(key=lambda j: float(j.get("submitted_at") or 0.0))
    if json_out:
        typer.echo(json.dumps({"jobs": [{**j, **job_times(j)} for j in jobs]}, default=str))
        return
    if not jobs:
        typer.echo("no matching jobs", err=True)
        return
    console.print(history_table(jobs, owners=bool(me.get("admin"))))
