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
    check_token_text(c.token)
    return Client(c.url, c.token, ca=c.ca)


def check_token_text(token: str) -> None:
    """A token is printable ASCII (an HTTP header); anything else is a one-line error, not
    an encoding traceback."""
    if not (token.isascii() and token.isprintable()):
        fail("the token holds characters other than printable ASCII (miso tokens are "
             "letters, digits, '-' and '_'): check --token, --token-file or $MISO_TOKEN")


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
    host_memory_gb: Annotated[float | None, typer.Option(
        "--host-memory-gb", help="Host (CPU) memory the job may hold, in GB (2^30 bytes); "
        "past it the job is ended (state over_limit).  [default: the node's]")] = None,
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
    time_limit: Annotated[str | None, typer.Option(
        "--time", help="Time limit, as Slurm's --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
        "D-HH:MM:SS. Past it the job is checkpointed (if it saves) and ended.  [default: your "
        "maximum, if an admin set one]")] = None,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"id": ...} JSON.')] = False,
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
    if host_memory_gb is not None:
        checks.positive(host_memory_gb, "--host-memory-gb")
    prio = _priority(priority)
    limit = _time_limit(time_limit)
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
                               time_limit_s=limit,
                               **({"host_memory_gb": host_memory_gb}
                                  if host_memory_gb is not None else {}),
                               **({"num_gpus": gpus, "nodes": nodes}
                                  if gpus != 1 or nodes is not None else {}))
                break
            except ApiError as e:  # retried only when the answer may have been lost
                if e.status not in (0, 502, 503, 504) or time.time() > deadline:
                    fail(e.message)
                time.sleep(1.0)
        typer.echo(json.dumps({"id": jid}) if json_out else jid)


def _time_limit(text: str | None) -> float | None:
    """``--time`` in seconds (one-line error on a bad one)."""
    if text is None:
        return None
    from miso.timelimit import parse_time

    try:
        return parse_time(text)
    except ValueError as e:
        fail(str(e))
        raise  # unreachable: fail exits


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
              "GPUs held / entitled", "queued", "on GPUs", "quota in use / queued"):
        t.add_column(c)
    for r in rows:
        recv = f"{r.get('held', 0):.1f} / {r.get('entitled', 0):.1f}"
        if r.get("owner") == "others" and "owners" in r:
            t.add_row(safe(f"others ({r['owners']})"), f"{100 * r.get('usage_share', 0):.0f}%",
                      f"{100 * r.get('share', 0):.0f}%", "-", f"{r.get('in_use', 0):.2f}",
                      recv, str(r.get("queued", 0)), str(r.get("running", 0)), "-")
            continue
        quota = f"{_or_dash(r.get('max_in_use'))} / {_or_dash(r.get('max_queued'))}"
        name = r.get("owner") if not r.get("account") else f"{r['owner']} ({r['account']})"
        t.add_row(safe(name), f"{100 * r.get('usage_share', 0):.0f}%",
                  f"{100 * r.get('share', 0):.0f}% ({r.get('weight', 1):g})",
                  f"{r.get('fair_share', 1):.2f}", f"{r.get('in_use', 0):.2f}", recv,
                  str(r.get("queued", 0)), str(r.get("running", 0)), quota)
    fair = st.get("fair_slices")
    if fair:
        t.caption = (f"fair slices: {fair.get('regime')} ({fair.get('pressure', 0):.1f} active "
                     f"jobs per GPU), at most {fair.get('fair_slice_cap', 0):.2f} of a GPU, "
                     f"estimated price {100 * fair.get('price_estimate', 0):.1f} % of "
                     f"{100 * fair.get('price', 0):.1f} %")
    return [t]


def _or_dash(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


def _progress(j: dict[str, Any]) -> str:
    it, tot = j.get("iteration"), j.get("total")
    if it is None:
        return "-"
    return f"{it}/{tot} ({100 * it / tot:.0f}%)" if tot else str(it)


#: Below this terminal width ``miso status`` prints its compact jobs table (80 columns).
WIDE = 110


def render_status(st: dict[str, Any], *, width: int | None = None) -> list[Table]:
    """Rich tables of an API status: GPUs (other users' jobs as a count), then jobs. All user
    text is escaped (:func:`miso.cli.text.safe`). On a terminal narrower than :data:`WIDE`
    (``width``) the jobs table keeps its short columns and each job's why/reason goes to a
    second two-column table below, so both fit 80 columns."""
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
    gpus = {g.get("id"): g for g in st.get("gpus", [])}
    for j in st.get("jobs", []):
        sl = j.get("placement") or "-"
        on = gpus.get(j.get("gpu")) or {}
        # MPS only while the job shares its GPU under MPS (profiling, an MPS plan): the
        # store keeps the last share after a MIG layout replaced it
        under_mps = on.get("phase") == "profiling" or j["id"] in (on.get("mps_shares") or {})
        if j.get("mps_pct") is not None and j["state"] in RUNS and (under_mps or not on):
            sl = f"MPS {j['mps_pct']}%"
        if j["state"] in (*TERMINAL, JobStatus.QUEUED):
            sl = "-"
        rate = f"{j['rate']:.1f}" if j.get("rate") and j["state"] in RUNS \
            else "-"
        row = [j["id"], j["name"], j["state"], j.get("gpu") or "-", sl, rate, _progress(j),
               str(j.get("restarts", 0)), j.get("why", j.get("reason")) or ""]
        if st.get("admin"):
            row.insert(1, j.get("owner_name") or j.get("owner") or "-")
        t.add_row(*(safe(x) for x in row))
    if width is not None and width < WIDE:
        t, why = compact_jobs(t, cols)
        return [g, t, *why, *owners_table(st), *lost_nodes_table(st, safe)]
    return [g, t, *owners_table(st), *lost_nodes_table(st, safe)]


def compact_jobs(t: Table, cols: list[str]) -> tuple[Table, list[Table]]:
    """The jobs table for 80 columns: id, owner, name, state, where (GPU and slice), progress
    and speed; the why/reason column as its own table (job, why) of the jobs that have one."""
    rows = list(zip(*(c.cells for c in t.columns), strict=True))
    at = {c: i for i, c in enumerate(cols)}
    out = Table(title=t.title)
    keep = ["id", *(["owner"] if "owner" in at else []), "name", "state", "where",
            "progress", "it/s"]
    for c in keep:
        out.add_column(c, overflow="ellipsis", no_wrap=True,
                       max_width=12 if c in ("name", "owner") else None)
    why = Table(title="Why (waiting) / reason (ended)", show_header=False)
    why.add_column("job", no_wrap=True)
    why.add_column("why", overflow="fold")
    for r in rows:
        where = " ".join(x for x in (str(r[at["gpu"]]), str(r[at["slice"]])) if x != "-") or "-"
        prog = str(r[at["progress"]])
        prog = prog.rsplit("(", 1)[-1].rstrip(")") if "(" in prog else prog
        vals = {"id": r[at["id"]], "owner": r[at["owner"]] if "owner" in at else "",
                "name": r[at["name"]], "state": r[at["state"]], "where": where,
                "progress": prog, "it/s": r[at["speed it/s"]]}
        out.add_row(*(vals[c] for c in keep))
        text = r[at["why (waiting) / reason (ended)"]]
        if str(text):
            why.add_row(r[at["id"]], text)
    return out, ([why] if why.row_count else [])


def lost_nodes_table(st: dict[str, Any], safe: Any) -> list[Table]:
    """A table of the nodes the controller lost (since when, why), or none."""
    lost = st.get("lost_nodes") or []
    if not lost:
        return []
    t = Table(title="LOST nodes")
    for c in ("node", "phase", "lost since", "back since", "why"):
        t.add_column(c, overflow="fold")
    for n in lost:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(n.get("since") or 0)))
        back = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(n["back"]))) \
            if n.get("back") else "-"
        t.add_row(*(safe(x) for x in (n.get("node"), n.get("phase"), since, back,
                                      n.get("why"))))
    return [t]


def summary_line(st: dict[str, Any]) -> str:
    """Counts first (what a big cluster's status starts with): jobs by state, yours and
    everyone's, then GPUs and nodes when the view says them."""
    def words(c: dict[str, int]) -> str:
        return ", ".join(f"{n} {k}" for k, n in sorted(c.items())) or "none"
    counts = st.get("counts") or {}
    line = f"jobs: {words(counts.get('mine') or {})}"
    if counts.get("all") is not None and counts.get("all") != counts.get("mine"):
        line += f" (everyone: {words(counts['all'])})"
    gpus = st.get("gpus")
    n = gpus if isinstance(gpus, int) else len(gpus or [])
    nodes = st.get("nodes")
    line += f"; GPUs: {n}; nodes: {nodes if isinstance(nodes, int) else len(nodes or [])}"
    if st.get("gpu_phases"):
        line += f" ({words(st['gpu_phases'])})"
    return line


def status(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    limit: Annotated[int, typer.Option("--limit", help="Show at most this many of the "
                                       "latest jobs.")] = 200,
    state: Annotated[str | None, typer.Option("--state", help="Only jobs in this state "
                                              "(queued, running, finished, ...).")] = None,
    owner: Annotated[str | None, typer.Option("--owner", help="Only this user's jobs "
                                              "(admins: any user).")] = None,
    summary: Annotated[bool, typer.Option("--summary", help="Counts only: jobs by state, "
                                          "GPUs, nodes (fast at any size).")] = False,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Redraw every --interval seconds until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(
        "--interval", help="Seconds between redraws with --watch.")] = 2.0,
    count: Annotated[int | None, typer.Option(
        "--count", min=1, help="With --watch: stop after N redraws.")] = None,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    address: RayAddress = None,
) -> None:
    """GPUs with their layouts, and your jobs with state, slice, speed and progress
    (--watch: again every --interval seconds until Ctrl-C)."""
    from miso.cli import checks

    checks.number(limit, "--limit", low=1)
    checks.number(interval, "--interval", low=0.2)
    with client(url, token, state_dir, address, token_file) as c:
        asked = {k: v for k, v in (("state", state), ("owner", owner), ("summary", summary))
                 if v}

        def draw() -> None:
            st = call(c.status, limit, **asked)
            if json_out:
                typer.echo(json.dumps(st, indent=2, default=str))
                return
            console.print(summary_line(st))
            if summary:
                return
            for tbl in render_status(st, width=console.width if console.is_terminal
                                     else None):
                console.print(tbl)
            others = sum(st.get("counts", {}).get("all", {}).values()) - \
                sum(st.get("counts", {}).get("mine", {}).values())
            if others > 0 and not st.get("admin"):
                console.print(f"{others} job(s) of other users not shown")

        if not watch:
            draw()
            return
        from miso.cli.follow import watch as repeat

        repeat(draw, interval, clear=console.clear, count=count)


def logs(
    job: Annotated[str, typer.Argument(help="Job id or name.")],
    tail: Annotated[int, typer.Option("--tail", help="Last lines of each attempt to print.")]
    = 200,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing new output until the job ends (Ctrl-C stops "
        "following; the job goes on).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"job", "text"} JSON.')]
    = False,
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
        typer.echo(json.dumps({"job": job, "text": text}) if json_out else text)
        return
    with client(url, token, state_dir, address, token_file) as c:
        if follow and not json_out:
            from miso.cli.follow import follow_logs

            try:
                state = follow_logs(c, job, echo=typer.echo, tail=tail)
            except KeyboardInterrupt:
                return
            typer.echo(f"(job {job} {state})", err=True)
            return
        text = call(c.logs, job, tail)
        typer.echo(json.dumps({"job": job, "text": text}) if json_out else text)


def _cluster_runs(state_dir: str) -> bool:
    """True when ``state_dir`` has a live cluster (a head of ours, or a remote controller)."""
    from miso import raycluster as rc

    info = rc.read_cluster_file(state_dir)
    return info is not None and (info.get("pid") == 0 or rc.is_our_head(info, state_dir))


def cancel(
    job: Annotated[str | None, typer.Argument(help="Job id or name (or use --all / a "
                                              "filter).")] = None,
    all_jobs: Annotated[bool, typer.Option(
        "--all", help="Cancel every active job of yours (with --state/--name: those "
        "matching).")] = False,
    state: Annotated[list[str] | None, typer.Option(
        "--state", help="Only jobs in this state (queued, running, profiling, "
        "checkpointing; repeatable).")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="Only jobs whose name matches this glob (e.g. 'sweep-*').")] = None,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"jobs": [...]} JSON.')]
    = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
    address: RayAddress = None,
) -> None:
    """Cancel one of your jobs (its process is killed), or with --all / --state / --name
    every active job of yours that matches."""
    from miso.cli.follow import ACTIVE, select_jobs

    by_filter = all_jobs or state or name is not None
    if (job is None) == (not by_filter):
        fail("give a job id or name, or --all / --state / --name (not both)")
    bad = [s for s in state or [] if s not in ACTIVE]
    if bad:
        fail(f"--state {bad[0]}: expected one of {', '.join(ACTIVE)}")
    with client(url, token, state_dir, address, token_file) as c:
        if job is not None:
            recs = [call(c.cancel, job)]
        else:
            chosen = select_jobs(call(c.jobs, active=True), states=list(state or ACTIVE),
                                 name=name)
            recs = [call(c.cancel, j["id"]) for j in chosen]
    if json_out:
        typer.echo(json.dumps({"jobs": [{"id": r["id"], "name": r.get("name"),
                                         "state": r["state"]} for r in recs]}))
        return
    for rec in recs:
        typer.echo(f"{rec['id']} {rec['state']}")
    if job is None and not recs:
        typer.echo("no matching active job", err=True)


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
    check_token_text(token)
    with Client(url, token, ca=ca_path) as c:
        me = call(c.me)
    path = save_login(url.rstrip("/"), token, ca_path)
    typer.echo(f"logged in to {url} as {me['name']}{' (admin)' if me['admin'] else ''}; "
               f"credentials in {path}")
