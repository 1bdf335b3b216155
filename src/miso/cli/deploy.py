"""``miso slurm run|ports`` and ``miso node``: miso inside a Slurm allocation, and one node's
Ray owned by one process (srun tasks, systemd units, Kubernetes pods). See docs/deploy.md."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from miso.cli.group import QuickHelpGroup
from miso.cli.text import fail

slurm_app = typer.Typer(help="Run a miso cluster inside a Slurm allocation.",
                        no_args_is_help=True, cls=QuickHelpGroup)

Grace = Annotated[float, typer.Option(
    "--grace", help="Seconds the processes get to exit after SIGTERM before SIGKILL (keep it "
    "under Slurm's KillWait, 30 s by default).")]


@slurm_app.command("run", context_settings={"allow_extra_args": True,
                                            "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    state_dir: Annotated[str | None, typer.Option(
        "--state-dir", help="State directory on a file system every node sees (default "
        "$MISO_STATE_DIR or ~/.miso/slurm).")] = None,
    grace: Grace = 20.0,
    gpus_per_node: Annotated[str | None, typer.Option(
        "--gpus-per-node", help="GPUs each node's step asks for (default: "
        "$SLURM_GPUS_ON_NODE, all of the allocation's).")] = None,
    start_timeout: Annotated[float, typer.Option(
        "--start-timeout", help="Seconds for every node to join.")] = 300.0,
) -> None:
    """Start Ray on every node of this allocation, the controller and API on the first, and
    stop it all (jobs checkpointed) when the allocation ends. Options after these go to
    `miso cluster up` (e.g. --emulated --gpus 4 --policy miso+)."""
    from miso.deploy import slurmrun

    if not (0 < grace < 3600):
        fail("--grace must be between 0 and 3600 seconds")
    sd = str(Path(state_dir or os.environ.get("MISO_STATE_DIR")
                  or Path.home() / ".miso" / "slurm").expanduser().resolve())
    try:
        from miso.deploy.slurm import job_id_from_env

        job_id_from_env(dict(os.environ))
    except ValueError as e:
        fail(f"{e}; submit deploy/slurm/miso.sbatch with sbatch")
    gpn = gpus_per_node or os.environ.get("SLURM_GPUS_ON_NODE") or None
    if gpn is not None and not gpn.isdigit():
        fail(f"--gpus-per-node must be a number, got {gpn!r}")
    raise typer.Exit(slurmrun.run(sd, list(ctx.args), grace=grace,
                                  gpus_per_node=int(gpn) if gpn else None,
                                  start_timeout=start_timeout))


@slurm_app.command("ports")
def ports(
    job_id: Annotated[int | None, typer.Option(
        "--job-id", help="Slurm job id (default $SLURM_JOB_ID).")] = None,
    check: Annotated[bool, typer.Option(
        "--check/--no-check", help="Skip blocks with a port taken on this node.")] = True,
    state_dir: Annotated[str | None, typer.Option(
        "--state-dir", help="The allocation's state directory (default $MISO_STATE_DIR or "
        "~/.miso/slurm): a running allocation's block is read from its slurm.json.")] = None,
) -> None:
    """Print the ports an allocation uses (JSON): the block a running allocation chose (its
    slurm.json), else the block derived from the job id."""
    from miso.deploy import node, slurm, slurmrun

    if job_id is None:
        try:
            job_id = slurm.job_id_from_env(dict(os.environ))
        except ValueError as e:
            fail(str(e))
    if job_id < 0:
        fail("--job-id must not be negative")
    sd = state_dir or os.environ.get("MISO_STATE_DIR") or str(Path.home() / ".miso" / "slurm")
    running = slurmrun.read_state(sd)
    if running is not None and running.get("job_id") == job_id and running.get("ports"):
        # its own ports are taken by itself: the block it chose, not the next free one
        typer.echo(json.dumps(running["ports"]))
        return
    try:
        p = slurm.choose_ports(job_id, node.port_free if check else lambda _p: True)
    except RuntimeError as e:
        fail(str(e))
    typer.echo(json.dumps(p.to_json()))


#: ``miso node`` passes the options after ``--`` to ``miso cluster up`` (with --controller).
NODE_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def node(
    ctx: typer.Context,
    head: Annotated[bool, typer.Option("--head", help="This node is Ray's head.")] = False,
    address: Annotated[str | None, typer.Option(
        "--address", help="HOST:PORT of the head's Ray (GCS).")] = None,
    port: Annotated[int, typer.Option("--port", help="GCS port of a --head node.")] = 6379,
    ports_block: Annotated[int | None, typer.Option(
        "--ports-block", help="Use every port of this block (miso slurm ports).")] = None,
    slurm_head: Annotated[str | None, typer.Option(
        "--slurm-head", help="In an srun step: the head is the task on this node name.")]
    = None,
    agent: Annotated[bool, typer.Option(
        "--agent/--no-agent", help="Offer the 'miso_agent' resource (run a miso agent).")]
    = True,
    controller: Annotated[bool, typer.Option(
        "--controller", help="On the head: also run miso's controller and API (`miso cluster "
        "up --address`, with the options after --); on stop every job saves first.")]
    = False,
    start_agent: Annotated[str | None, typer.Option(
        "--start-agent", help="Once joined, start the miso agent of every agent node that "
        "lacks one: 'nvml' (real GPUs) or 'emulated'.")] = None,
    gpus: Annotated[int, typer.Option("--gpus", help="Emulated GPUs (--start-agent "
                                      "emulated).")] = 4,
    temp_dir: Annotated[str | None, typer.Option(
        "--temp-dir", help="This node's private runtime dir (created 0700, refused if it "
        "exists and is not ours; Ray's temp dir is <it>/r; short; removed on exit). Default: "
        "a fresh one under /tmp.")] = None,
    node_ip: Annotated[str | None, typer.Option(
        "--node-ip", help="This node's IP for Ray (default: Ray's choice).")] = None,
    num_cpus: Annotated[int | None, typer.Option(
        "--num-cpus", help="CPUs Ray offers (default $SLURM_CPUS_ON_NODE, else all).")]
    = None,
    num_gpus: Annotated[int | None, typer.Option("--num-gpus", help="GPUs Ray offers.")]
    = None,
    state_dir: Annotated[str | None, typer.Option(
        "--state-dir", help="miso's state directory (Ray's token is taken from it when "
        "RAY_AUTH_TOKEN_PATH is not set).")] = None,
    grace: Grace = 20.0,
    join_timeout: Annotated[float, typer.Option(
        "--join-timeout", help="Seconds to wait for the head / for Ray to start.")] = 300.0,
) -> None:
    """Run this node's Ray in the foreground and own it: on SIGTERM the jobs save (--grace
    seconds), then Ray and every process below it stop. For srun, systemd units, pods."""
    from miso import raytoken
    from miso.deploy import node as nd
    from miso.deploy import slurm

    if slurm_head is not None:
        here = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        head = here == slurm_head
    if not head and not address:
        fail("give --head, or the head's --address HOST:PORT")
    if controller and not head:
        fail("--controller runs on the head only (--head)")
    if ctx.args and not controller:
        fail(f"unexpected arguments {' '.join(ctx.args)!r} (they go to `miso cluster up` "
             "with --controller)")
    if start_agent not in (None, "nvml", "emulated"):
        fail(f"--start-agent must be nvml or emulated, got {start_agent!r}")
    if (controller or start_agent) and state_dir is None:
        state_dir = os.environ.get("MISO_STATE_DIR")
        if not state_dir:
            fail("--controller and --start-agent need --state-dir (or $MISO_STATE_DIR)")
    if not (0 < grace < 3600):
        fail("--grace must be between 0 and 3600 seconds")
    os.environ["RAY_AUTH_MODE"] = "token"  # never without it
    if not os.environ.get("RAY_AUTH_TOKEN_PATH") and not os.environ.get("RAY_AUTH_TOKEN"):
        if state_dir is None:
            fail("no Ray token: set RAY_AUTH_TOKEN_PATH or give --state-dir")
        f = raytoken.token_file(state_dir)
        if not f.exists():
            if not head:
                fail(f"no Ray token in {f}")
            raytoken.ensure(state_dir)
        raytoken.use(f)
    if state_dir is not None:
        os.environ["MISO_STATE_DIR"] = state_dir
    if ports_block is not None:
        try:
            plan = slurm.RayPorts.of_block(ports_block)
        except ValueError as e:
            fail(str(e))
        gcs = plan.gcs
    else:
        plan = None
        gcs = port
    if num_cpus is None and os.environ.get("SLURM_CPUS_ON_NODE", "").isdigit():
        num_cpus = int(os.environ["SLURM_CPUS_ON_NODE"])
    resources = {"miso_agent": 1.0} if agent else None
    private, temp_dir = _private_temp(temp_dir)
    if plan is not None:
        args = slurm.ray_start_args(plan, head=head, address=address, node_ip=node_ip,
                                    temp_dir=temp_dir, resources=resources,
                                    num_cpus=num_cpus, num_gpus=num_gpus,
                                    taken=lambda p: not nd.port_free(p),
                                    ray_client=importlib.util.find_spec("grpc") is not None)
    else:
        args = ["start", "--block", "--disable-usage-stats"]
        args += [f"--port={gcs}", "--head", "--include-dashboard=false"] if head \
            else [f"--address={address}"]
        for flag, v in (("--node-ip-address", node_ip), ("--temp-dir", temp_dir),
                        ("--num-cpus", num_cpus), ("--num-gpus", num_gpus)):
            if v is not None:
                args.append(f"{flag}={v}")
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
    if head:
        host, probe_port = node_ip or "127.0.0.1", gcs
    else:
        host, _, p = (address or "").rpartition(":")
        probe_port = int(p) if p.isdigit() else 0
    gcs_address = f"{host}:{probe_port}"
    if not head:  # the head may start a little later in the same srun step
        deadline = time.time() + join_timeout
        while not nd.port_open(host, probe_port):
            if time.time() > deadline:
                fail(f"the head's Ray at {address} did not answer within {join_timeout:.0f}s")
            time.sleep(0.5)
    node_obj = nd.Node(args, grace=grace)
    started = {"at": 0.0}

    def ready() -> bool:
        if not started["at"]:
            started["at"] = time.time()
        # the head is up when its GCS listens; a worker once `ray start` has had time to
        # register (it exits at once when it cannot)
        return nd.port_open(host, probe_port) if head else time.time() - started["at"] > 3

    def on_ready() -> None:
        if controller:
            r = subprocess.run([sys.executable, "-m", "miso.cli", "cluster", "up",
                                "--address", gcs_address, "--state-dir", str(state_dir),
                                *ctx.args], stdin=subprocess.DEVNULL, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"miso cluster up failed (exit {r.returncode})")
        if start_agent:
            backend = {"kind": "nvml"} if start_agent == "nvml" else \
                {"kind": "emulated", "gpus": gpus}
            subprocess.run([sys.executable, "-m", "miso.deploy.actions", "agents", gcs_address,
                            json.dumps(backend), str(Path(str(state_dir)) / "agents")],
                           stdin=subprocess.DEVNULL, check=False, timeout=300)

    def before_stop() -> None:
        if controller and node_obj.running():
            subprocess.run([sys.executable, "-m", "miso.deploy.actions", "drain", gcs_address,
                            f"{max(1.0, grace - 5):g}"], stdin=subprocess.DEVNULL,
                           check=False, timeout=grace + 15)

    say = lambda s: typer.echo(s, err=s.startswith("error"))  # noqa: E731
    try:
        code = nd.serve(node_obj, ready=ready, on_ready=on_ready, before_stop=before_stop,
                        ready_timeout=join_timeout, say=say)
    except RuntimeError as e:
        say(f"error: {e}")
        code = 1
    finally:
        shutil.rmtree(private, ignore_errors=True)
    raise typer.Exit(code)


def _private_temp(temp_dir: str | None) -> tuple[str, str]:
    """(the node's private runtime dir, Ray's temp dir inside it): ``--temp-dir`` created
    0700 and refused when it exists and is not ours, else a fresh one under /tmp (never
    Ray's shared default /tmp/ray). See docs/security.md."""
    from miso import runtimedir

    try:
        private = runtimedir.make_private(temp_dir) if temp_dir else \
            runtimedir.fresh_private("miso-node-")
        return str(private), runtimedir.ray_temp_dir(private)
    except (OSError, ValueError, runtimedir.UnsafeRuntimeDir) as e:
        fail(f"--temp-dir: {e}")
