"""The ``miso`` command line: hardware model, optimizer, predictor, simulator and live cluster."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.table import Table

from miso.cli import checks
from miso.cli.group import QuickHelpGroup
from miso.cli.text import fail, make_console

if TYPE_CHECKING:
    from miso.mig import Geometry

#: Set to 1 to see the traceback of an unexpected error instead of its one-line summary.
DEBUG_ENV = "MISO_DEBUG"


class OneLineErrors(QuickHelpGroup):
    """The root command: every error is one line on stderr and a non-zero exit, no traceback.

    Usage errors (a missing option, a value of the wrong type, a failed :mod:`miso.cli.checks`
    check) exit 2; an unexpected exception exits 1 with its type and message (``MISO_DEBUG=1``
    re-raises it).
    """

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except typer.TyperException as exc:  # usage errors, InputError included
            msg = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            if type(exc).__name__ == "NoArgsIsHelpError":  # its message is the help (as typer)
                typer.echo(msg, err=True)
                sys.exit(2)
            _die(msg, int(getattr(exc, "exit_code", 2)))
        except typer.Abort:
            _die("aborted", 1)
        except Exception as exc:  # noqa: BLE001 - the last resort: still one line
            if os.environ.get(DEBUG_ENV) == "1":
                raise
            _die(f"unexpected {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the "
                 "traceback)", 1)
        sys.exit(code if isinstance(code, int) else 0)


def _die(message: str, code: int) -> NoReturn:
    line = " ".join(message.split()) or "failed"
    typer.echo(line if line.startswith("error:") else f"error: {line}", err=True)
    sys.exit(code)


app = typer.Typer(
    cls=OneLineErrors,
    help="miso: share NVIDIA GPUs among ML jobs with MIG (MPS profiling, prediction, "
    "optimal partitioning).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish)
    rich_markup_mode=None,
)
console = make_console()


def _version(value: bool) -> None:
    if value:
        from miso import __version__

        typer.echo(f"miso {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print miso's version and exit.")] = False,
) -> None:
    """miso: share NVIDIA GPUs among ML jobs with MIG (MPS profiling, prediction, optimal
    partitioning)."""


#: MIG first shipped with driver R450; a smaller major version is a typo.
MIN_DRIVER = 450


def _geometry(gpu: str, profiles: str | None = None, driver: int | None = None) -> Geometry:
    from miso.mig import geometry

    names = checks.names(profiles, "--profiles") if profiles is not None else None
    if driver is not None and driver < MIN_DRIVER:
        fail(f"--driver {driver}: a driver major version with MIG is {MIN_DRIVER} or more")
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


#: ``--gpu-model`` is a GPU model in every command; ``--gpu``, its old spelling here, is
#: hidden (``miso events`` takes a GPU id as ``--gpu-id``).
GpuModel = Annotated[str | None, typer.Option(
    "--gpu-model", help="GPU model, e.g. A100-40GB (see `miso gpus`; required).")]
OldGpu = Annotated[str | None, typer.Option("--gpu", hidden=True,
                                            help="Old spelling of --gpu-model.")]


def _model_flag(gpu_model: str | None, gpu: str | None) -> str:
    return checks.required(checks.alias(gpu_model, gpu, "--gpu-model", "--gpu"), "--gpu-model")


@app.command()
def layouts(
    gpu_model: GpuModel = None,
    profiles: Annotated[str | None, typer.Option(
        help="Comma-separated profiles to use (default: the scheduler's).")] = None,
    driver: Annotated[int | None, typer.Option(
        help="Driver major version; <510 applies the A100 4g+3g ban.")] = None,
    maximal: Annotated[bool, typer.Option(
        help="Only layouts no instance can be added to.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    gpu: OldGpu = None,
) -> None:
    """Enumerate the valid MIG layouts of a GPU."""
    from miso.mig import enumerate_layouts

    geom = _geometry(_model_flag(gpu_model, gpu), profiles, driver)
    lays = enumerate_layouts(geom, maximal=maximal)
    if json_out:
        typer.echo(json.dumps([[pl.to_json() for pl in lay] for lay in lays]))
        return
    for lay in lays:
        typer.echo("  ".join(str(pl) for pl in lay))
    kind = "maximal layouts" if maximal else "layouts"
    typer.echo(f"{len(lays)} {kind} on {geom.model.name} (driver R{geom.driver})", err=True)


#: A speeds file holds at most 7 jobs; 1 MiB is far more than any real one.
MAX_SPEEDS_BYTES = checks.MIB


def _load_speeds(path: Path) -> dict[str, dict[str, float]]:
    data = checks.read_json(path, "--speeds", max_bytes=MAX_SPEEDS_BYTES)
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
            if isinstance(s, float) and s != s:
                fail(f"speeds file {path}: job {job!r} speed on {prof!r} is NaN")
        out[str(job)] = {str(p): float(s) for p, s in speeds.items()}
    return out


@app.command()
def optimize(
    speeds: Annotated[Path, typer.Option(
        help='JSON file {"jobs": {"<job id>": {"<profile>": speed, ...}, ...}}; speed is relative '
        "to the full GPU, a missing profile means the job does not fit there.")],
    objective: Annotated[str, typer.Option(
        help="throughput | restart-aware | fairness")] = "throughput",
    driver: Annotated[int | None, typer.Option(help="Driver major version.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    gpu_model: GpuModel = None,
    gpu: OldGpu = None,
) -> None:
    """Best MIG layout and job-to-slice assignment for up to 7 jobs."""
    from miso.optimize import Objective, OptimizerError, optimizer_for

    geom = _geometry(_model_flag(gpu_model, gpu), None, driver)
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
    from miso.cli import client as cli_client
    from miso.cli import cluster as cli_cluster
    from miso.cli import demo as cli_demo
    from miso.cli import events as cli_events
    from miso.cli import predictor as cli_predictor
    from miso.cli import quota as cli_quota
    from miso.cli import simulate as cli_simulate
    from miso.cli import users as cli_users
    from miso.cli.doctor import doctor

    app.add_typer(cli_predictor.app, name="predictor")
    app.command("simulate")(cli_simulate.simulate)
    app.add_typer(cli_cluster.cluster_app, name="cluster")
    for name in ("submit", "status", "logs", "cancel", "login"):
        app.command(name)(getattr(cli_client, name))
    app.add_typer(cli_users.user_app, name="user")
    app.add_typer(cli_quota.quota_app, name="quota")
    app.command("demo")(cli_demo.demo)
    app.command("doctor")(doctor)
    app.command("events")(cli_events.events)
    from miso.cli import serve as cli_serve  # inference services (docs/serving.md)
    for name in ("serve", "services", "load"):
        app.command(name)(getattr(cli_serve, name))
    from miso.cli import follow as cli_follow  # finished jobs' times (issue 33)
    app.command("history")(cli_follow.history)
    from miso.cli import requeue as cli_requeue
    from miso.cli import web as cli_web
    app.command("requeue")(cli_requeue.requeue)
    app.command("web")(cli_web.web)
    from miso.cli import deploy as cli_deploy  # the deploy paths (docs/deploy.md)
    app.add_typer(cli_deploy.slurm_app, name="slurm")
    app.command("node", context_settings=cli_deploy.NODE_CONTEXT)(cli_deploy.node)


_mount()


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="miso")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
