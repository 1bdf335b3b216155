"""The ``miso`` command line: hardware model, optimizer, predictor, simulator and live cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from miso.mig import Geometry

app = typer.Typer(
    help="miso: share NVIDIA GPUs among ML jobs with MIG (MPS profiling, prediction, "
    "optimal partitioning).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error to stderr and exit non-zero (no traceback)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _geometry(gpu: str, profiles: str | None = None, driver: int | None = None) -> Geometry:
    from miso.mig import geometry

    names = [p.strip() for p in profiles.split(",") if p.strip()] if profiles else None
    try:
        return geometry(gpu, names, driver)
    except (KeyError, ValueError) as exc:
        fail(str(exc.args[0]) if exc.args else str(exc))


@app.command()
def gpus(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """List the GPU models miso knows and their MIG profiles."""
    from dataclasses import asdict

    from miso.mig import GPU_MODELS

    if json_out:
        out = []
        for m in GPU_MODELS.values():
            out.append({
                "name": m.name, "full_name": m.full_name, "pci_device_ids": list(m.pci_device_ids),
                "placement_units": m.units, "compute_slices": m.compute_slices,
                "aliases": list(m.aliases),
                "profiles": [asdict(p) for p in m.profiles],
            })
        typer.echo(json.dumps(out, indent=2))
        return
    for m in GPU_MODELS.values():
        t = Table(title=f"{m.name}  ({m.full_name}; {m.units} placement units)",
                  title_justify="left")
        for col in ("profile", "id", "nvml idx", "SMs", "GiB", "size", "starts", "max", "default"):
            t.add_column(col)
        for p in m.profiles:
            t.add_row(p.name, str(p.profile_id), str(p.nvml_index), str(p.sm_count),
                      f"{p.memory_gib:.2f}", str(p.size), ",".join(map(str, p.starts)),
                      str(p.max_count), "yes" if p.default else "")
        console.print(t)


@app.command()
def layouts(
    gpu: Annotated[str, typer.Option(help="GPU model, e.g. A100-40GB (see `miso gpus`).")],
    profiles: Annotated[str | None, typer.Option(
        help="Comma-separated profiles to use (default: the scheduler's).")] = None,
    driver: Annotated[int | None, typer.Option(
        help="Driver major version; <510 applies the A100 4g+3g ban.")] = None,
    maximal: Annotated[bool, typer.Option(
        help="Only layouts no instance can be added to.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Enumerate the valid MIG layouts of a GPU."""
    from miso.mig import enumerate_layouts

    geom = _geometry(gpu, profiles, driver)
    lays = enumerate_layouts(geom, maximal=maximal)
    if json_out:
        typer.echo(json.dumps([[pl.to_json() for pl in lay] for lay in lays]))
        return
    for lay in lays:
        typer.echo("  ".join(str(pl) for pl in lay))
    kind = "maximal layouts" if maximal else "layouts"
    typer.echo(f"{len(lays)} {kind} on {geom.model.name} (driver R{geom.driver})", err=True)


def _load_speeds(path: Path) -> dict[str, dict[str, float]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        fail(f"speeds file {path} not found")
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"speeds file {path} is not valid JSON: {exc}")
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, dict) or not jobs:
        shape = '{"jobs": {"<job id>": {"<profile>": speed}}}'
        fail(f"speeds file {path}: expected {shape}")
    out: dict[str, dict[str, float]] = {}
    for job, speeds in jobs.items():
        if not isinstance(speeds, dict):
            fail(f"speeds file {path}: job {job!r} must map profiles to speeds")
        for prof, s in speeds.items():
            if isinstance(s, bool) or not isinstance(s, (int, float)):
                fail(f"speeds file {path}: job {job!r} speed on {prof!r} is not a number")
        out[str(job)] = {str(p): float(s) for p, s in speeds.items()}
    return out


@app.command()
def optimize(
    gpu: Annotated[str, typer.Option(help="GPU model, e.g. A100-40GB.")],
    speeds: Annotated[Path, typer.Option(
        help='JSON file {"jobs": {"<job id>": {"<profile>": speed, ...}, ...}}; speed is relative '
        "to the full GPU, a missing profile means the job does not fit there.")],
    objective: Annotated[str, typer.Option(
        help="throughput | restart-aware | fairness")] = "throughput",
    driver: Annotated[int | None, typer.Option(help="Driver major version.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Best MIG layout and job-to-slice assignment for up to 7 jobs."""
    from miso.optimize import Objective, OptimizerError, optimizer_for

    geom = _geometry(gpu, None, driver)
    job_speeds = _load_speeds(speeds)
    try:
        obj = Objective(objective)
    except ValueError:
        fail(f"unknown objective {objective!r}; use throughput, restart-aware or fairness")
    try:
        sol = optimizer_for(geom).solve(job_speeds, objective=obj)
    except OptimizerError as exc:
        fail(str(exc))
    if json_out:
        typer.echo(json.dumps(sol.to_json()))
        return
    t = Table(title=f"{geom.model.name}: {obj.value} = {sol.objective:.4f}", title_justify="left")
    for col in ("instance", "job", "speed"):
        t.add_column(col)
    job_of = {pl: j for j, pl in sol.assignment.items()}
    for pl in sol.layout:
        j = job_of[pl]
        t.add_row(str(pl), j, f"{job_speeds[j][pl.profile]:.3f}")
    console.print(t)


def _mount() -> None:
    """Attach the predictor, simulator and live-cluster commands (imported lazily inside)."""
    from miso import cli_cluster, cli_demo, cli_events, cli_predictor, cli_simulate
    from miso.doctor import doctor

    app.add_typer(cli_predictor.app, name="predictor")
    app.command("simulate")(cli_simulate.simulate)
    app.add_typer(cli_cluster.cluster_app, name="cluster")
    for name in ("submit", "status", "logs", "cancel"):
        app.command(name)(getattr(cli_cluster, name))
    app.command("demo")(cli_demo.demo)
    app.command("doctor")(doctor)
    app.command("events")(cli_events.events)


_mount()


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="miso")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
