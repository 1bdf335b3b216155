"""``miso demo``: an emulated cluster running a stream of real job processes."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from miso.cli.demo_cluster import DemoLocal, DemoRay, demo_jobs, policy_args, summarize
from miso.cli.text import fail, make_console
from miso.jobstatus import TERMINAL

console = make_console()
err_console = make_console(stderr=True)




def demo(
    gpus: Annotated[int, typer.Option("--gpus", help="Emulated GPUs.")] = 4,
    jobs: Annotated[int, typer.Option("--jobs", help="Jobs to submit.")] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print only the JSON summary.")]
    = False,
    gpu_model: Annotated[str, typer.Option(
        "--gpu-model", help="Emulated GPU model (see `miso gpus`).")] = "A100-40GB",
    policy: Annotated[str, typer.Option(
        "--policy", help="Scheduling policy: miso+ (ours, default), miso (the paper's), "
        "oracle, optsta, mps or nopart.")] = "miso+",
    compare: Annotated[str | None, typer.Option(
        "--compare", help="Also run the same stream under this policy (e.g. nopart) and "
        "print both and the JCT ratio.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the job stream.")] = 0,
    no_ray: Annotated[bool, typer.Option("--no-ray", help="Run in-process, without Ray.")]
    = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Give up after (s).")] = 600.0,
) -> None:
    """Run an emulated cluster, submit a mixed stream of jobs, show progress and a summary.

    The stream has more jobs than GPUs (contention is where partitioning pays) and each job
    does about 20 s of full-GPU work, 10-30x one emulated profiling level (1 s: shortened from
    the paper's 10 s so the demo takes minutes); every restart costs its job 2 s of warm-up.
    """
    from miso.mig import gpu_model as find_model
    from miso.sched import policy_names

    try:
        model = find_model(gpu_model).name
    except KeyError as e:
        fail(str(e.args[0]))
    if gpus < 1 or jobs < 1:
        fail("--gpus and --jobs must be at least 1")
    if not (timeout > 0):
        fail("--timeout must be a positive number of seconds")
    known = policy_names()
    for p in [policy] + ([compare] if compare is not None else []):
        if p not in known:
            fail(f"unknown policy {p!r}; known: {', '.join(known)}")
    if compare == policy:
        fail(f"--compare {compare} is the policy itself; name another policy")
    out = err_console if json_out else console
    stream = demo_jobs(jobs, seed)
    results: dict[str, Any] = {}
    args = {}
    for p in [policy] + ([compare] if compare else []):
        try:
            args[p] = policy_args(p, stream, gpus, model)
        except ValueError as e:
            fail(str(e))
    for p in [policy] + ([compare] if compare else []):
        lay = args[p].get("layout")
        out.print(f"[bold]policy {p}[/bold]: {jobs} jobs on {gpus} emulated {model} GPUs"
                  + (f" (static layout {' '.join(pl.profile for pl in lay)}, the best for "
                     "this stream in the simulator)" if lay else ""))
        summary, rows = _run_stream(p, stream, gpus, model, no_ray, timeout, out, args[p])
        if lay:
            summary["layout"] = [pl.profile for pl in lay]
        results[p] = (summary, rows)
    summary = results[policy][0]
    if compare:
        other = results[compare][0]
        ratio = (round(summary["avg_jct_s"] / other["avg_jct_s"], 3)
                 if summary["avg_jct_s"] and other["avg_jct_s"] else None)
        doc: dict[str, Any] = {policy: summary, compare: other, "jct_ratio": ratio}
    else:
        doc = summary
    if json_out:
        typer.echo(json.dumps(doc))
    else:
        for p, (s, rows) in results.items():
            t = Table(title=f"Jobs under {p}")
            for c in ("id", "name", "state", "JCT s", "restarts"):
                t.add_column(c)
            for r in rows:
                t.add_row(*r)
            console.print(t)
            console.print(f"{p}: {json.dumps(s)}")
        if compare:
            console.print(f"average JCT {policy} / {compare}: {doc['jct_ratio']}")
    if any(s["completed"] != jobs for s, _ in results.values()):
        raise typer.Exit(1)


def _run_stream(policy: str, stream: list[tuple[float, str, list[str]]], gpus: int,
                model: str, no_ray: bool, timeout: float, out: Console,
                args: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, ...]]]:
    """Run one policy over the stream on a fresh emulated cluster; (summary, table rows)."""
    from rich.markup import escape

    d = tempfile.mkdtemp(prefix="miso-demo-")
    cfg = {"policy": policy, "profile_seconds_per_level": 1.0, "checkpoint_timeout": 10.0,
           "estimator": "auto", "policy_args": args}
    cluster: Any = None
    t_start = time.time()
    st: dict[str, Any] = {}
    try:
        if no_ray:
            cluster = DemoLocal(d, gpus, model, cfg)
        else:
            try:
                out.print(f"starting a local Ray with {gpus} emulated {model} GPUs ...")
                cluster = DemoRay(d, gpus, model, cfg)
            except Exception as e:  # noqa: BLE001 - any Ray start failure ends the demo
                import ray

                ray.shutdown()
                fail(f"Ray did not start ({type(e).__name__}: {e}); run `miso demo --no-ray` "
                      f"for the in-process cluster")
        out.print(f"cluster up in {time.time() - t_start:.1f}s; submitting {len(stream)} jobs")
        t0 = time.time()
        pending = list(stream)
        last_print = 0.0
        while True:
            now = time.time() - t0
            while pending and pending[0][0] <= now:
                _, name, cmd = pending.pop(0)
                cluster.submit(cmd, name)
            st = cluster.status()
            active = [j for j in st["jobs"] if j["state"] not in TERMINAL]
            if time.time() - last_print >= 5.0:
                last_print = time.time()
                counts: dict[str, int] = {}
                for j in st["jobs"]:
                    counts[j["state"]] = counts.get(j["state"], 0) + 1
                lays = "  ".join(f"{g['id']}: {' '.join(g['layout']) or '-'}"
                                 for g in st["gpus"])
                out.print(escape(f"[{now:5.1f}s] " + ", ".join(
                    f"{k} {v}" for k, v in sorted(counts.items())) + f" | {lays}"))
            if not pending and not active:
                break
            if time.time() - t0 > timeout:
                out.print("[red]demo timed out[/red]")
                break
            time.sleep(0.5)
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(d, ignore_errors=True)
    rows = []
    for j in st.get("jobs", []):
        jct = j["ended_at"] - j["submitted_at"] if j.get("ended_at") is not None else None
        rows.append((j["id"], j["name"], j["state"], f"{jct:.1f}" if jct else "-",
                     str(j.get("restarts", 0))))
    return summarize(st.get("jobs", [])), rows
