"""``miso cluster up|down``, ``submit``, ``status``, ``logs``, and ``cancel``.

The lead mounts these on the main app::

    app.add_typer(cluster_app, name="cluster")
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("logs")(logs)
    app.command("cancel")(cancel)

Every command reaches the cluster through Ray: the address comes from ``--address``, else the
``cluster.json`` that ``miso cluster up`` writes in the state directory (``--state-dir``,
``$MISO_STATE_DIR``, default ``~/.miso/cluster``), else ``RAY_ADDRESS``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

cluster_app = typer.Typer(help="Start or stop a miso cluster (controller + agents on Ray).",
                          no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)

StateDir = Annotated[str | None, typer.Option(
    "--state-dir", help="Cluster state directory (default $MISO_STATE_DIR or ~/.miso/cluster).")]
Address = Annotated[str | None, typer.Option(
    "--address", help="Ray address of a running cluster ('auto' to find it).")]


def _fail(msg: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _state_dir(state_dir: str | None) -> str:
    return str(Path(state_dir or os.environ.get("MISO_STATE_DIR")
                    or Path.home() / ".miso" / "cluster").expanduser().resolve())


def _connect(state_dir: str | None, address: str | None) -> Any:
    """Connect to the cluster and return the controller actor handle."""
    from miso import raycluster as rc

    addr = address
    if addr is None:
        f = rc.cluster_file(_state_dir(state_dir))
        if f.exists():
            addr = json.loads(f.read_text()).get("address")
    addr = addr or os.environ.get("RAY_ADDRESS")
    if not addr:
        _fail("no miso cluster found: run `miso cluster up --emulated` (or pass --address)")
    try:
        rc.connect(addr)
        return rc.controller()
    except ValueError:
        _fail(f"Ray at {addr} runs no miso controller: run `miso cluster up`")
    except Exception as e:  # noqa: BLE001 - Ray raises many kinds here
        _fail(f"cannot reach the cluster at {addr}: {e}")


def _get(ref: Any, timeout: float = 60.0) -> Any:
    import ray

    deadline = time.time() + timeout
    while True:
        try:
            return ray.get(ref(), timeout=max(1.0, deadline - time.time()))
        except Exception as e:  # noqa: BLE001 - e.g. the controller is restarting
            if time.time() > deadline:
                _fail(f"the controller did not answer: {type(e).__name__}: {e}")
            time.sleep(1.0)


def _config(policy: str, profile_seconds: float, checkpoint_timeout: float,
            estimator: str) -> dict[str, Any]:
    return {"policy": policy, "profile_seconds_per_level": profile_seconds,
            "checkpoint_timeout": checkpoint_timeout, "estimator": estimator}


# ---- cluster up / down ----------------------------------------------------------------------


@cluster_app.command("up")
def up(
    emulated: Annotated[bool, typer.Option("--emulated", help="Emulated GPUs (no hardware).")]
    = False,
    gpus: Annotated[int, typer.Option("--gpus", help="Emulated GPUs per node.")] = 4,
    gpu_model: Annotated[str, typer.Option("--gpu-model", help="Emulated GPU model.")]
    = "A100-40GB",
    address: Address = None,
    state_dir: StateDir = None,
    policy: Annotated[str, typer.Option(
        "--policy", help="Scheduling policy: miso+ (ours, default), miso (the paper's), "
        "oracle, optsta, mps or nopart.")] = "miso+",
    profile_seconds: Annotated[float, typer.Option(
        "--profile-seconds", help="MPS profiling seconds per level (levels run in the order "
        "50 %, 14 %, 100 % active threads).")] = 10.0,
    checkpoint_timeout: Annotated[float, typer.Option(
        "--checkpoint-timeout", help="Seconds a job gets to checkpoint before it is killed.")]
    = 30.0,
    estimator: Annotated[str, typer.Option(
        "--estimator", help="Speed estimator: auto, predictor, heuristic, true or noisy.")]
    = "auto",
) -> None:
    """Start the controller and one agent per GPU node.

    One machine: ``miso cluster up --emulated --gpus 4`` starts a private local Ray with
    everything in it. Many machines: ``ray start`` on each node (GPU nodes with
    ``--resources '{"miso_agent": 1}'``), then ``miso cluster up --address auto``.
    """
    from miso import raycluster as rc
    from miso.mig import gpu_model as find_model

    sd = _state_dir(state_dir)
    try:
        model = find_model(gpu_model).name
    except KeyError as e:
        _fail(str(e.args[0]))
    if gpus < 1:
        _fail("--gpus must be at least 1")
    cfg = _config(policy, profile_seconds, checkpoint_timeout, estimator)
    if address is None:
        if not emulated:
            _fail("give --address for a Ray cluster with real GPUs, or --emulated")
        f = rc.cluster_file(sd)
        if f.exists():
            _fail(f"a cluster already runs from {sd} (miso cluster down first)")
        info = rc.spawn_local_head(sd, gpus=gpus, model=model, config=cfg)
        console.print(f"miso cluster up: {gpus} emulated {model} GPUs, Ray at "
                      f"{info['address']}, state in {sd}")
        return
    rc.connect(address)
    import ray

    backend = {"kind": "emulated", "gpus": gpus, "model": model} if emulated \
        else {"kind": "nvml"}
    nodes = rc.start_agents(backend, str(Path(sd) / "agents"))
    if not nodes:
        _fail("no Ray node offers the 'miso_agent' resource or a GPU")
    rc.start_controller(sd, cfg)
    Path(sd).mkdir(parents=True, exist_ok=True)
    rc.cluster_file(sd).write_text(json.dumps({
        "address": ray.get_runtime_context().gcs_address, "pid": 0, "state_dir": sd,
        "nodes": nodes, "emulated": emulated}))
    console.print(f"miso cluster up: controller + agents on {', '.join(nodes)}")


@cluster_app.command("down")
def down(state_dir: StateDir = None, address: Address = None) -> None:
    """Stop every job, the controller and the agents (and the local Ray this CLI started)."""
    from miso import raycluster as rc

    sd = _state_dir(state_dir)
    f = rc.cluster_file(sd)
    info = json.loads(f.read_text()) if f.exists() else {}
    if info.get("pid"):
        rc.stop_local_head(sd)
        console.print("miso cluster down: local cluster stopped")
        return
    addr = address or info.get("address") or os.environ.get("RAY_ADDRESS")
    if not addr:
        _fail(f"no cluster recorded in {sd}; pass --address")
    rc.connect(addr)
    rc.stop_actors(stop_jobs=True)
    f.unlink(missing_ok=True)
    console.print("miso cluster down: controller and agents stopped")


# ---- jobs -----------------------------------------------------------------------------------


def submit(
    command: Annotated[list[str], typer.Argument(help="The command, after `--`.")],
    name: Annotated[str | None, typer.Option("--name", help="Unique job name.")] = None,
    memory_gb: Annotated[float | None, typer.Option(
        "--memory-gb", help="Peak GPU memory of the job (GB).")] = None,
    state_dir: StateDir = None,
    address: Address = None,
) -> None:
    """Submit a job: ``miso submit --name x --memory-gb 8 -- python train.py``. Prints its id."""
    h = _connect(state_dir, address)
    res = _get(lambda: h.submit.remote(list(command), name, memory_gb, None, None,
                                       os.getcwd()))
    if not res["ok"]:
        _fail(res["error"])
    typer.echo(res["id"])


def _progress(j: dict[str, Any]) -> str:
    it, tot = j.get("iteration"), j.get("total")
    if it is None:
        return "-"
    return f"{it}/{tot} ({100 * it / tot:.0f}%)" if tot else str(it)


def render_status(st: dict[str, Any]) -> list[Table]:
    """Rich tables of a controller status: GPUs, then jobs."""
    g = Table(title="GPUs")
    for c in ("gpu", "model", "phase", "layout", "jobs"):
        g.add_column(c)
    for gpu in st.get("gpus", []):
        jobs = [f"{j}@{gpu['assignment'][j]}" if j in gpu["assignment"] else
                f"{j}(mps {gpu['mps_shares'][j]}%)" if j in gpu["mps_shares"] else j
                for j in gpu["jobs"]]
        g.add_row(gpu["id"], gpu["model"], gpu["phase"], " ".join(gpu["layout"]) or "-",
                  ", ".join(jobs) or "-")
    t = Table(title=f"Jobs (policy {st.get('policy', '?')})")
    for c in ("id", "name", "state", "gpu", "slice", "speed it/s", "progress", "restarts",
              "reason"):
        t.add_column(c)
    for j in st.get("jobs", []):
        sl = j.get("placement") or "-"
        if j.get("mps_pct") is not None and j["state"] in ("profiling", "running"):
            sl = f"MPS {j['mps_pct']}%"
        if j["state"] in ("finished", "failed", "cancelled", "queued"):
            sl = "-"
        rate = f"{j['rate']:.1f}" if j.get("rate") and j["state"] in ("running", "profiling") \
            else "-"
        t.add_row(j["id"], j["name"], j["state"], j.get("gpu") or "-", sl, rate, _progress(j),
                  str(j.get("restarts", 0)), (j.get("reason") or "")[:60])
    return [g, t]


def status(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    state_dir: StateDir = None,
    address: Address = None,
) -> None:
    """GPUs with their layouts, and jobs with state, slice, speed and progress."""
    h = _connect(state_dir, address)
    st = _get(lambda: h.status.remote())
    if json_out:
        typer.echo(json.dumps(st, indent=2, default=str))
        return
    for tbl in render_status(st):
        console.print(tbl)


def logs(
    job: Annotated[str, typer.Argument(help="Job id or name.")],
    tail: Annotated[int, typer.Option("--tail", help="Last lines of each attempt to print.")]
    = 200,
    state_dir: StateDir = None,
    address: Address = None,
) -> None:
    """Print the output of every attempt of a job."""
    h = _connect(state_dir, address)
    res = _get(lambda: h.logs.remote(job, tail))
    if not res["ok"]:
        _fail(res["error"])
    typer.echo(res["text"])


def cancel(
    job: Annotated[str, typer.Argument(help="Job id or name.")],
    state_dir: StateDir = None,
    address: Address = None,
) -> None:
    """Cancel a job (its process is killed)."""
    h = _connect(state_dir, address)
    res = _get(lambda: h.cancel.remote(job))
    if not res["ok"]:
        _fail(res["error"])
    typer.echo(f"{res['job']['id']} {res['job']['state']}")
