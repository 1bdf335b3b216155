"""``miso slurm run``: a miso cluster for the lifetime of a Slurm allocation.

Run as the batch script's last command (``exec miso slurm run ...``, see
deploy/slurm/miso.sbatch) on the allocation's first node. It

1. chooses the allocation's ports (:func:`miso.deploy.slurm.choose_ports`) and records them,
   with the nodes and the head's address, in ``<state dir>/slurm.json``;
2. starts one ``miso node`` task per node with one ``srun`` step (the first node is Ray's
   head, the others join it); each owns its node's Ray and every process below it;
3. once every node has joined, runs ``miso cluster up --address ...`` (controller and HTTP
   API on this node, one agent per node) with the options it was given;
4. waits. On SIGTERM or SIGINT (``#SBATCH --signal=B:TERM@120`` before the time limit,
   ``scancel --batch --signal=TERM``, or plain ``scancel``) it halts the controller, asks
   every job to save and exit (:func:`miso.raycluster.checkpoint_jobs`), stops the agents,
   then stops the srun step: every node stops its Ray and reaps what is left, and the
   allocation ends with nothing running.

A plain ``scancel`` sends SIGTERM to every process of the allocation at once, Ray's included,
so the launcher may find Ray gone: then the jobs save on their own SIGTERM
(:mod:`miso.job`), their guards let them finish saving, and the next allocation on the same
state directory resumes them from those saves.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miso.deploy import node as nodes_mod
from miso.deploy import slurm

STATE_FILE = "slurm.json"


@dataclass
class Plan:
    """Where the allocation's cluster runs (written to ``slurm.json``)."""

    job_id: int
    nodes: list[str]
    head: str
    head_ip: str
    ports: slurm.RayPorts
    temp_dir: str
    state_dir: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.ports.gcs}"

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "nodes": self.nodes, "head": self.head,
                "address": self.address, "ports": self.ports.to_json(),
                "temp_dir": self.temp_dir, "state_dir": self.state_dir, **self.extra}


def hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (``gpu[01-03]``) with ``scontrol show hostnames``."""
    if not any(c in nodelist for c in "[],"):
        return [nodelist] if nodelist else []
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, check=True, timeout=30)
    return out.stdout.split()


def head_address(head: str, n_nodes: int, given: str | None = None) -> str:
    """The address the other nodes reach the head's Ray at: ``given`` ($MISO_HEAD_IP), else
    loopback for a one-node allocation, else the head's name resolved. A loopback answer for
    several nodes (Debian's /etc/hosts maps the host name to 127.0.1.1) is refused."""
    if given:
        return given
    if n_nodes == 1:
        return "127.0.0.1"
    ip = socket.gethostbyname(head)
    if ip.startswith("127."):
        raise RuntimeError(f"the head {head} resolves to {ip}, which the other nodes cannot "
                           "reach; set MISO_HEAD_IP to its address on the cluster network")
    return ip


def make_plan(state_dir: str, env: dict[str, str]) -> Plan:
    job_id = slurm.job_id_from_env(env)
    listed = hostnames(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    here = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if not listed:
        listed = [here]
    head = here if here in listed else listed[0]
    node_list = [head] + [n for n in listed if n != head]
    head_ip = head_address(head, len(node_list), env.get("MISO_HEAD_IP"))
    ports = slurm.choose_ports(job_id, nodes_mod.port_free)
    return Plan(job_id, node_list, head, head_ip, ports, slurm.temp_dir_for(job_id), state_dir)


def write_state(plan: Plan) -> Path:
    f = Path(plan.state_dir) / STATE_FILE
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan.to_json(), indent=1))
    os.replace(tmp, f)
    return f


def read_state(state_dir: str | Path) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def miso_cmd(*args: str) -> list[str]:
    """This interpreter's ``miso`` (the same environment on every node)."""
    return [sys.executable, "-m", "miso.cli", *args]


def node_command(plan: Plan, *, grace: float, gpus_per_node: int | None,
                 cpus_per_node: int | None) -> list[str]:
    """The ``srun`` command line that runs ``miso node`` on every node of the plan."""
    srun = ["srun", f"--job-name={STEP_NAME}",
            *slurm.srun_node_args(plan.nodes, cpus_per_node=cpus_per_node,
                                  gpus_per_node=gpus_per_node)]
    return [*srun, *miso_cmd(
        "node", "--slurm-head", plan.head, "--address", plan.address,
        "--ports-block", str(plan.ports.block), "--temp-dir", plan.temp_dir,
        "--grace", f"{grace:g}", "--state-dir", plan.state_dir,
        *(["--node-ip", "127.0.0.1"] if plan.head_ip == "127.0.0.1" else []))]


def wait_for_nodes(plan: Plan, step: subprocess.Popen[bytes], timeout: float,
                   stopped: Callable[[], bool] = lambda: False) -> None:
    """Block until every node of the plan runs a Ray node offering ``miso_agent`` (or
    ``stopped()``)."""
    deadline = time.time() + timeout
    while not nodes_mod.port_open(plan.head_ip, plan.ports.gcs) and not stopped():
        if step.poll() is not None:
            raise RuntimeError(f"the node step exited with {step.returncode} before Ray "
                               "came up")
        if time.time() > deadline:
            raise RuntimeError(f"Ray's head did not open {plan.address} within {timeout:.0f}s")
        time.sleep(0.3)
    probe = ("import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False, "
             "configure_logging=False); print(sum(1 for n in ray.nodes() if n['Alive'] and "
             "n['Resources'].get('miso_agent', 0) >= 1))")
    while not stopped():
        try:
            r = subprocess.run([sys.executable, "-c", probe, plan.address],
                               capture_output=True, text=True, timeout=30)
            out = r.stdout.split() if r.returncode == 0 else []
        except subprocess.TimeoutExpired:
            out = []
        joined = int(out[-1]) if out and out[-1].isdigit() else 0
        if joined >= len(plan.nodes):
            return
        if step.poll() is not None:
            raise RuntimeError(f"the node step exited with {step.returncode}")
        if time.time() > deadline:
            raise RuntimeError(f"{joined} of {len(plan.nodes)} nodes joined Ray within "
                               f"{timeout:.0f}s")
        time.sleep(0.5)


STEP_NAME = "miso-nodes"


def find_step(job_id: int) -> str | None:
    """``JOB.STEP`` of the allocation's node step (named :data:`STEP_NAME`), or None."""
    try:
        r = subprocess.run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i %j"],
                           capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in r.stdout.splitlines():
        sid, _, name = line.partition(" ")
        if name.strip() == STEP_NAME:
            return sid
    return None


def has_option(args: list[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def run(state_dir: str, up_args: list[str], *, grace: float = slurm.DEFAULT_GRACE_S,
        gpus_per_node: int | None = None, start_timeout: float = 300.0) -> int:
    """The whole life of the allocation's cluster (see the module docstring); returns the exit
    code for the batch script."""
    from miso import raytoken  # noqa: PLC0415

    stop = {"sig": 0}

    def on_signal(sig: int, _frame: object) -> None:
        stop["sig"] = sig

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, on_signal)
    os.umask(0o077)
    Path(state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    raytoken.use_state_dir(state_dir)  # RAY_AUTH_* for every process started from here
    os.environ["MISO_STATE_DIR"] = state_dir
    try:
        plan = make_plan(state_dir, dict(os.environ))
    except (RuntimeError, ValueError, OSError, subprocess.SubprocessError) as e:
        say(f"error: {e}")
        return 1
    write_state(plan)
    say(f"miso slurm: job {plan.job_id}, {len(plan.nodes)} node(s) {','.join(plan.nodes)}, "
        f"Ray at {plan.address} (port block {plan.ports.block}), state in {state_dir}")
    cpus = os.environ.get("SLURM_CPUS_ON_NODE", "")
    step = subprocess.Popen(node_command(plan, grace=grace, gpus_per_node=gpus_per_node,
                                         cpus_per_node=int(cpus) if cpus.isdigit() else None),
                            stdin=subprocess.DEVNULL)
    code = 0
    try:
        wait_for_nodes(plan, step, start_timeout, lambda: bool(stop["sig"]))
        if not stop["sig"]:
            up = miso_cmd("cluster", "up", "--address", plan.address, "--state-dir",
                          state_dir, *up_args)
            from miso.deploy.upconfig import config_sets  # noqa: PLC0415

            if not has_option(up_args, "--listen") and not config_sets(up_args, "listen"):
                up += ["--listen", f"127.0.0.1:{plan.ports.api}"]
            r = subprocess.run(up, stdin=subprocess.DEVNULL, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"miso cluster up failed (exit {r.returncode})")
            api = _api_url(state_dir)
            plan.extra.update({"api_url": api, "up_at": time.time()})
            write_state(plan)
            say(f"miso slurm: cluster up; API at {api}")
        while not stop["sig"] and step.poll() is None:
            time.sleep(0.3)
        if not stop["sig"]:
            say(f"error: a node's miso left the allocation (exit {step.returncode})")
            code = 1
    except RuntimeError as e:
        say(f"error: {e}")
        code = 1
    finally:
        teardown(plan, step, grace)
    return code


def _api_url(state_dir: str) -> str | None:
    try:
        return json.loads((Path(state_dir) / "cluster.json").read_text()).get("api_url")
    except (OSError, ValueError):
        return None


def teardown(plan: Plan, step: subprocess.Popen[bytes], grace: float) -> None:
    """Checkpoint the jobs through the controller, then stop every node's Ray."""
    t0 = time.time()
    if step.poll() is None and nodes_mod.port_open(plan.head_ip, plan.ports.gcs):
        try:
            subprocess.run([sys.executable, "-m", "miso.deploy.actions", "drain",
                            plan.address, f"{max(1.0, grace - 5):g}"],
                           stdin=subprocess.DEVNULL, timeout=grace + 15, check=False)
        except subprocess.TimeoutExpired:
            say("miso slurm: the jobs did not all save in time; stopping the nodes")
    if step.poll() is None:
        # SIGTERM to the step's tasks (every node's `miso node`); a SIGTERM to srun itself
        # would make it kill the step at once
        step_id = find_step(plan.job_id)
        if step_id is not None:
            subprocess.run(["scancel", "--signal=TERM", step_id], check=False, timeout=30,
                           capture_output=True)  # fails when Slurm ends the step itself
        else:
            step.send_signal(signal.SIGTERM)
        try:
            step.wait(timeout=grace + 15)
        except subprocess.TimeoutExpired:
            step.kill()
            step.wait()
    plan.extra["down_at"] = time.time()
    write_state(plan)
    say(f"miso slurm: down in {time.time() - t0:.1f}s")


def say(line: str) -> None:
    print(line, flush=True)

