"""What ``miso status`` draws from the API's status: the GPUs and jobs tables (an 80-column
form of the jobs table), the owners' usage, the lost nodes and the one-line counts. Pure
functions of the status JSON; the command itself is :func:`miso.cli.client.status`."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from miso.jobstatus import TERMINAL, JobStatus

#: States in which a job has a process on a GPU.
RUNS = (JobStatus.PROFILING, JobStatus.RUNNING)


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
                     f"jobs per GPU), at most {fair.get('fair_slice_cap', 0):.2f} of a GPU"
                     + (f" ({fair.get('fair_slice_up', 0):.2f} for "
                        f"{100 * fair.get('share_up', 0):.0f} % of the jobs)"
                        if fair.get("share_up") else "")
                     + f", estimated price {100 * fair.get('price_estimate', 0):.1f} % of "
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
