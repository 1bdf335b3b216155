"""``miso submit``, ``status``, ``logs``, ``cancel`` and ``login``: clients of the HTTP API.

They find the server and the token as :mod:`miso.api.credentials` says: ``--url``/``--token``,
``MISO_URL``/``MISO_TOKEN``, a named state directory, the ``miso login`` config, the default
state directory. Nothing here talks to Ray.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from miso.cli.text import fail, make_console
from miso.jobstatus import TERMINAL, JobStatus

if TYPE_CHECKING:  # the HTTP client is imported when a command runs (``--help`` stays fast)
    from miso.api.client import Client

console = make_console()

Url = Annotated[str | None, typer.Option(
    "--url", help="API URL of the cluster (default $MISO_URL, the state dir or `miso login`).")]
Token = Annotated[str | None, typer.Option(
    "--token", help="API token. Visible to every local account in the process list: prefer "
    "--token-file or $MISO_TOKEN (default: --token-file, $MISO_TOKEN, the state dir or "
    "`miso login`).")]
TokenFile = Annotated[str | None, typer.Option(
    "--token-file", help="Read the API token from this file (keep it 0600); or set "
    "$MISO_TOKEN. Neither shows in the process list.")]
StateDir = Annotated[str | None, typer.Option(
    "--state-dir", help="Local cluster state directory (default $MISO_STATE_DIR or "
    "~/.miso/cluster).")]
RayAddress = Annotated[str | None, typer.Option(
    "--address", hidden=True, help="Gone: the job commands speak the HTTP API (--url).")]

#: Variables of miso and Ray themselves, never sent with ``--env-all``.
#: States in which a job has a process on a GPU.
RUNS = (JobStatus.PROFILING, JobStatus.RUNNING)
_INTERNAL = re.compile(r"^(MISO_|RAY_)")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def default_state_dir() -> Path:
    return Path.home() / ".miso" / "cluster"


def explicit_token(token: str | None, token_file: str | None) -> str | None:
    """The token ``--token`` or ``--token-file`` gives (None: neither). An empty one is an
    error, never a fall-back to another token (e.g. the operator's)."""
    if token is not None and token_file is not None:
        fail("give --token or --token-file, not both")
    if token is not None:
        if not token.strip():
            fail("--token is empty; give a token, --token-file FILE or $MISO_TOKEN")
        return token.strip()
    if token_file is not None:
        try:
            text = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            fail(f"--token-file {token_file}: {getattr(e, 'strerror', None) or e}")
        if not text:
            fail(f"--token-file {token_file} is empty")
        return text
    return None


def client(url: str | None, token: str | None, state_dir: str | None,
           address: str | None = None, token_file: str | None = None) -> Client:
    """A client for the cluster the flags, environment or files name (one-line errors)."""
    from miso.api.client import Client
    from miso.api.credentials import resolve

    token = explicit_token(token, token_file)

    if address is not None:
        fail(f"--address {address}: the job commands speak the cluster's HTTP API now; give "
             "--url URL (printed by `miso cluster up`)")
    if url is not None and not url.startswith(("http://", "https://")):
        fail(f"--url {url}: expected http://HOST:PORT or https://HOST:PORT")

    c = resolve(url=url, token=token, state_dir=state_dir,
                default_state_dir=default_state_dir())
    if not c.url:
        fail("no miso cluster found: run `miso cluster up --emulated`, or `miso login --url "
             "URL` for a remote one (or set MISO_URL)")
    if not c.token:
        fail(f"no token for {c.url}: run `miso login --url {c.url}` (or set MISO_TOKEN)")
    return Client(c.url, c.token, ca=c.ca)


def call(fn: Any, *args: Any, **kw: Any) -> Any:
    from miso.api.client import ApiError

    try:
        return fn(*args, **kw)
    except ApiError as e:
        fail(e.message)


def parse_env(pairs: list[str], env_all: bool) -> dict[str, str]:
    """``--env K=V`` pairs over (with ``--env-all``) this shell's environment, minus miso's and
    Ray's own variables."""
    env = {k: v for k, v in os.environ.items()
           if env_all and _ENV_KEY.match(k) and not _INTERNAL.match(k)}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not _ENV_KEY.match(k):
            fail(f"--env {p!r}: expected NAME=VALUE with a variable name")
        env[k] = v
    return env


def resolve_program(command: list[str], path: str | None = None) -> list[str]:
    """``command`` with its program as this shell finds it: a bare name (``python``) becomes
    the absolute path on the submitter's ``PATH`` (or the job's ``--env PATH``), so the job runs
    the same program whatever ``PATH`` its account gets. Unknown names stay as they are (the
    cluster refuses them with the fix)."""
    import shutil

    if not command or "/" in command[0]:
        return command
    found = shutil.which(command[0], path=path)
    return [os.path.abspath(found), *command[1:]] if found else command


def submit(
    command: Annotated[list[str], typer.Argument(help="The command, after `--`.")],
    name: Annotated[str | None, typer.Option(
        "--name", help="Job name, unique among your active and finished jobs (a failed or "
        "cancelled job's name is free again).  [default: the job id]")] = None,
    memory_gb: Annotated[float | None, typer.Option(
        "--memory-gb", help="Peak GPU memory of the job in GB (10^9 bytes); it gets a slice "
        "at least this large.  [default: 1 GiB = 1.07 GB, or an emulated workload's own]")]
    = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", help="Set a variable in the job's environment (NAME=VALUE; repeatable).")]
    = None,
    env_all: Annotated[bool, typer.Option(
        "--env-all", help="Pass this shell's whole environment (except MISO_*/RAY_*).")]
    = False,
    priority: Annotated[str | None, typer.Option(
        "--priority", help="high, normal, low or an integer: waiting jobs are placed highest "
        "priority first (clusters with tenancy: `miso cluster up --fair-share`). Above normal "
        "needs an admin or the priority limit an admin gave you (`miso quota`).  "
        "[default: normal]")] = None,
    gpus: Annotated[int, typer.Option(
        "--gpus", help="Whole GPUs the job runs on at once: one process per GPU, all started, "
        "checkpointed and restarted together (a gang), each given RANK, LOCAL_RANK, "
        "WORLD_SIZE, MASTER_ADDR and MASTER_PORT for torch.distributed.  [default: 1]")] = 1,
    nodes: Annotated[int | None, typer.Option(
        "--nodes", help="Spread the --gpus over exactly this many nodes, equal counts each.  "
        "[default: as few nodes as fit]")] = None,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    address: RayAddress = None,
) -> None:
    """Submit a job: ``miso submit --name x --memory-gb 8 -- python train.py``. Prints its id.

    The job runs in this directory with the agent's environment (less miso's and Ray's own
    variables; a job run as another Unix account gets only a standard PATH, LANG, HOME and
    USER), plus --env/--env-all and miso's own (CUDA_VISIBLE_DEVICES, MISO_*; see miso.job).
    A bare program name is sent as the absolute path this shell finds (`python` ->
    /path/to/venv/bin/python)."""
    from miso.cli import checks

    if memory_gb is not None:
        checks.positive(memory_gb, "--memory-gb")
    prio = _priority(priority)
    if gpus < 1 or (nodes is not None and (nodes < 1 or gpus % nodes)):
        fail(f"--gpus must be >= 1 and --nodes divide it evenly (got {gpus}, {nodes})")
    variables = parse_env(list(env or []), env_all)
    from miso.api.client import ApiError

    command = resolve_program(list(command), variables.get("PATH"))
    request = uuid.uuid4().hex  # one id for every retry below: at most one job
    deadline = time.time() + 30
    with client(url, token, state_dir, address, token_file) as c:
        while True:
            try:
                jid = c.submit(list(command), name=name, memory_gb=memory_gb, env=variables,
                               cwd=os.getcwd(), request_id=request, priority=prio,
                               **({"num_gpus": gpus, "nodes": nodes}
                                  if gpus != 1 or nodes is not None else {}))
                break
            except ApiError as e:  # retried only when the answer may have been lost
                if e.status not in (0, 502, 503, 504) or time.time() > deadline:
                    fail(e.message)
                time.sleep(1.0)
        typer.echo(jid)


#: Named priority classes (the server's :data:`miso.sched.tenancyconfig.PRIORITY_CLASSES`; the
#: name is sent, the server decides).
PRIORITIES = ("high", "normal", "low")


def _priority(v: str | None) -> str | int | None:
    """``--priority`` as sent: a class name, an integer, or None (normal: not sent)."""
    if v is None:
        return None
    p = v.strip().lower()
    if p in PRIORITIES:
        return None if p == "normal" else p
    try:
        return int(p)
    except ValueError:
        fail(f"--priority {v!r}: expected high, normal, low or an integer")


def owners_table(st: dict[str, Any]) -> list[Table]:
    """Usage against entitlement per owner (status ``owners``; a user who is not an admin
    gets its own row and ``others`` as counts), or none when tenancy is off."""
    from miso.cli.text import safe

    rows = st.get("owners")
    if not rows:
        return []
    t = Table(title="Owners: usage against entitlement (GPU-equivalents)")
    for c in ("owner", "usage share", "share (weight)", "fair-share factor", "in use",
              "queued", "on GPUs", "quota in use / queued"):
        t.add_column(c)
    for r in rows:
        if r.get("owner") == "others" and "owners" in r:
            t.add_row(safe(f"others ({r['owners']})"), f"{100 * r.get('usage_share', 0):.0f}%",
                      f"{100 * r.get('share', 0):.0f}%", "-", f"{r.get('in_use', 0):.2f}",
                      str(r.get("queued", 0)), str(r.get("running", 0)), "-")
            continue
        quota = f"{_or_dash(r.get('max_in_use'))} / {_or_dash(r.get('max_queued'))}"
        t.add_row(safe(r.get("owner")), f"{100 * r.get('usage_share', 0):.0f}%",
                  f"{100 * r.get('share', 0):.0f}% ({r.get('weight', 1):g})",
                  f"{r.get('fair_share', 1):.2f}", f"{r.get('in_use', 0):.2f}",
                  str(r.get("queued", 0)), str(r.get("running", 0)), quota)
    return [t]


def _or_dash(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


def _progress(j: dict[str, Any]) -> str:
    it, tot = j.get("iteration"), j.get("total")
    if it is None:
        return "-"
    return f"{it}/{tot} ({100 * it / tot:.0f}%)" if tot else str(it)


def render_status(st: dict[str, Any]) -> list[Table]:
    """Rich tables of an API status: GPUs (other users' jobs as a count), then jobs. All user
    text is escaped (:func:`miso.cli.text.safe`)."""
    from miso.cli.text import safe
    g = Table(title="GPUs")
    for c in ("gpu", "model", "phase", "layout", "jobs"):
        g.add_column(c)
    for gpu in st.get("gpus", []):
        jobs = [f"{j}@{gpu['assignment'][j]}" if j in gpu["assignment"] else
                f"{j}(mps {gpu['mps_shares'][j]}%)" if j in gpu["mps_shares"] else j
                for j in gpu["jobs"]]
        if gpu.get("other_jobs"):
            jobs.append(f"+{gpu['other_jobs']} of other users")
        g.add_row(*(safe(x) for x in (gpu["id"], gpu["model"], gpu["phase"],
                                      " ".join(gpu["layout"]) or "-", ", ".join(jobs) or "-")))
    who = f"{st.get('user')}{' (admin)' if st.get('admin') else ''}"
    t = Table(title=safe(f"Jobs of {who} (policy {st.get('policy', '?')})"))
    cols = ["id", "name", "state", "gpu", "slice", "speed it/s", "progress", "restarts",
            "why (waiting) / reason (ended)"]
    if st.get("admin"):
        cols.insert(1, "owner")
    for c in cols:
        t.add_column(c, overflow="fold" if c.startswith("why") else "ellipsis")
    for j in st.get("jobs", []):
        sl = j.get("placement") or "-"
        if j.get("mps_pct") is not None and j["state"] in RUNS:
            sl = f"MPS {j['mps_pct']}%"
        if j["state"] in (*TERMINAL, JobStatus.QUEUED):
            sl = "-"
        rate = f"{j['rate']:.1f}" if j.get("rate") and j["state"] in RUNS \
            else "-"
        row = [j["id"], j["name"], j["state"], j.get("gpu") or "-", sl, rate, _progress(j),
               str(j.get("restarts", 0)), j.get("why", j.get("reason")) or ""]
        if st.get("admin"):
            row.insert(1, j.get("owner") or "-")
        t.add_row(*(safe(x) for x in row))
    return [g, t, *owners_table(st), *lost_nodes_table(st, safe)]


def lost_nodes_table(st: dict[str, Any], safe: Any) -> list[Table]:
    """A table of the nodes the controller lost (since when, why), or none."""
    lost = st.get("lost_nodes") or []
    if not lost:
        return []
    t = Table(title="LOST nodes")
    for c in ("node", "phase", "lost since", "why"):
        t.add_column(c, overflow="fold")
    for n in lost:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(n.get("since") or 0)))
        t.add_row(*(safe(x) for x in (n.get("node"), n.get("phase"), since, n.get("why"))))
    return [t]


def status(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    limit: Annotated[int, typer.Option("--limit", help="Show at most this many of the "
                                       "latest jobs.")] = 200,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    address: RayAddress = None,
) -> None:
    """GPUs with their layouts, and your jobs with state, slice, speed and progress."""
    from miso.cli import checks

    checks.number(limit, "--limit", low=1)
    with client(url, token, state_dir, address, token_file) as c:
        st = call(c.status, limit)
    if json_out:
        typer.echo(json.dumps(st, indent=2, default=str))
        return
    for tbl in render_status(st):
        console.print(tbl)
    others = sum(st.get("counts", {}).get("all", {}).values()) - \
        sum(st.get("counts", {}).get("mine", {}).values())
    if others > 0 and not st.get("admin"):
        console.print(f"{others} job(s) of other users not shown")


def logs(
    job: Annotated[str, typer.Argument(help="Job id or name.")],
    tail: Annotated[int, typer.Option("--tail", help="Last lines of each attempt to print.")]
    = 200,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    address: RayAddress = None,
) -> None:
    """Print the output of every attempt of one of your jobs."""
    from miso.cli import checks

    checks.number(tail, "--tail", low=1)
    sd = state_dir or os.environ.get("MISO_STATE_DIR") or str(default_state_dir())
    if url is None and address is None and not os.environ.get("MISO_URL") and \
            (Path(sd) / "miso.db").exists() and not _cluster_runs(sd):
        from miso.controller.offline import logs_from_disk

        try:
            text = logs_from_disk(sd, job, tail)
        except LookupError as e:
            fail(str(e))
        typer.echo(f"(no cluster runs from {sd}: logs read from disk)", err=True)
        typer.echo(text)
        return
    with client(url, token, state_dir, address, token_file) as c:
        typer.echo(call(c.logs, job, tail))


def _cluster_runs(state_dir: str) -> bool:
    """True when ``state_dir`` has a live cluster (a head of ours, or a remote controller)."""
    from miso import raycluster as rc

    info = rc.read_cluster_file(state_dir)
    return info is not None and (info.get("pid") == 0 or rc.is_our_head(info, state_dir))


def cancel(
    job: Annotated[str, typer.Argument(help="Job id or name.")],
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    address: RayAddress = None,
) -> None:
    """Cancel one of your jobs (its process is killed)."""
    with client(url, token, state_dir, address, token_file) as c:
        rec = call(c.cancel, job)
    typer.echo(f"{rec['id']} {rec['state']}")


def login(
    url: Annotated[str, typer.Option("--url", help="API URL the admin gave you.")],
    token: Annotated[str | None, typer.Option(
        "--token", help="Your token (asked for when not given; or $MISO_TOKEN or "
        "--token-file: a token on the command line is visible in the process list).")]
    = None,
    token_file: TokenFile = None,
    ca: Annotated[str | None, typer.Option(
        "--ca", help="CA certificate (PEM) of a server with a private certificate.")] = None,
) -> None:
    """Check a token against the server and keep URL and token in ~/.miso/config.json (0600;
    $MISO_CONFIG elsewhere)."""
    from miso.api.client import Client
    from miso.api.credentials import save_login

    token = explicit_token(token, token_file) or os.environ.get("MISO_TOKEN") or \
        typer.prompt("token", hide_input=True)
    if ca is not None and not Path(ca).is_file():
        fail(f"--ca {ca}: no such file")
    ca_path = str(Path(ca).resolve()) if ca else None
    with Client(url, token, ca=ca_path) as c:
        me = call(c.me)
    path = save_login(url.rstrip("/"), token, ca_path)
    typer.echo(f"logged in to {url} as {me['name']}{' (admin)' if me['admin'] else ''}; "
               f"credentials in {path}")
