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

from miso.demo import DemoLocal, DemoRay, demo_jobs, summarize

console = Console()
err_console = Console(stderr=True)


def _fail(msg: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def demo(
    gpus: Annotated[int, typer.Option("--gpus", help="Emulated GPUs.")] = 4,
    jobs: Annotated[int, typer.Option("--jobs", help="Jobs to submit.")] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print only the JSON summary.")]
    = False,
    gpu_model: Annotated[str, typer.Option(
        "--gpu-model", help="Emulated GPU model (see `miso gpus`).")] = "A100-40GB",
    policy: Annotated[str, typer.Option(
        "--policy", help="Scheduling policy: nopart, optsta, mps, miso, oracle or miso+.")]
    = "miso",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the job stream.")] = 0,
    no_ray: Annotated[bool, typer.Option("--no-ray", help="Run in-process, without Ray.")]
    = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Give up after (s).")] = 600.0,
) -> None:
    """Run an emulated cluster, submit a mixed stream of jobs, show progress and a summary."""
    from miso.mig import gpu_model as find_model

    try:
        model = find_model(gpu_model).name
    except KeyError as e:
        _fail(str(e.args[0]))
    if gpus < 1 or jobs < 1:
        _fail("--gpus and --jobs must be at least 1")
    out = err_console if json_out else console
    d = tempfile.mkdtemp(prefix="miso-demo-")
    cfg = {"policy": policy, "profile_seconds_per_level": 1.0, "checkpoint_timeout": 10.0,
           "estimator": "auto"}
    stream = demo_jobs(jobs, seed)
    cluster: Any = None
    t_start = time.time()
    try:
        if not no_ray:
            try:
                out.print(f"starting a local Ray with {gpus} emulated {model} GPUs ...")
                cluster = DemoRay(d, gpus, model, cfg)
            except Exception as e:  # noqa: BLE001 - fall back to the in-process cluster
                out.print(f"[yellow]Ray did not start ({type(e).__name__}: {e}); running "
                          f"in-process[/yellow]")
                import ray

                ray.shutdown()
                cluster = None
        if cluster is None:
            cluster = DemoLocal(d, gpus, model, cfg)
        out.print(f"cluster up in {time.time() - t_start:.1f}s; submitting {jobs} jobs")
        t0 = time.time()
        pending = list(stream)
        last_print = 0.0
        st: dict[str, Any] = {}
        while True:
            now = time.time() - t0
            while pending and pending[0][0] <= now:
                _, name, cmd = pending.pop(0)
                cluster.submit(cmd, name)
            st = cluster.status()
            active = [j for j in st["jobs"] if j["state"] not in
                      ("finished", "failed", "cancelled")]
            if time.time() - last_print >= 5.0:
                last_print = time.time()
                counts: dict[str, int] = {}
                for j in st["jobs"]:
                    counts[j["state"]] = counts.get(j["state"], 0) + 1
                lays = "  ".join(f"{g['id']}: {' '.join(g['layout']) or '-'}"
                                 for g in st["gpus"])
                out.print(f"[{now:5.1f}s] " + ", ".join(f"{k} {v}" for k, v in
                                                       sorted(counts.items())) + f" | {lays}")
            if not pending and not active:
                break
            if time.time() - t0 > timeout:
                out.print("[red]demo timed out[/red]")
                break
            time.sleep(0.5)
        summary = summarize(st["jobs"])
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(d, ignore_errors=True)
    if json_out:
        typer.echo(json.dumps(summary))
    else:
        t = Table(title="Jobs")
        for c in ("id", "name", "state", "JCT s", "restarts"):
            t.add_column(c)
        for j in st["jobs"]:
            jct = j["ended_at"] - j["submitted_at"] if j.get("ended_at") is not None else None
            t.add_row(j["id"], j["name"], j["state"], f"{jct:.1f}" if jct else "-",
                      str(j.get("restarts", 0)))
        console.print(t)
        console.print(f"summary: {json.dumps(summary)}  (wall {time.time() - t_start:.0f}s)")
    if summary["completed"] != jobs:
        raise typer.Exit(1)
