"""Pure helpers for a miso cluster inside a Slurm allocation: ports, Ray arguments, names.

Two allocations may share a node (non-exclusive partitions, or two small allocations), so no
port is Ray's fixed default: each allocation takes a block of :data:`BLOCK` ports, the block
first tried derived from ``SLURM_JOB_ID`` (``job_id % BLOCKS``), the next ones when a port of it
is taken on the head node. The block chosen is recorded in the state directory
(``slurm.json``) and passed to every node, so the nodes agree without asking each other.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

#: First port of the lowest block; blocks end below 60000 (Linux's default ephemeral range
#: starts at 32768, so a block there may meet a client socket: then the next block is used).
PORT_BASE = 20000
#: Ports per allocation: 10 named ones, the rest Ray's worker processes (one each).
BLOCK = 100
BLOCKS = 400
#: Seconds between SIGTERM and SIGKILL the teardown plans for: Slurm's default ``KillWait``
#: is 30 s, and everything must be gone before it.
DEFAULT_GRACE_S = 25.0

_NAMED = ("gcs", "client", "dashboard_agent", "dashboard_agent_grpc", "metrics",
          "node_manager", "object_manager", "runtime_env_agent", "api")


@dataclass(frozen=True)
class RayPorts:
    """The ports of one allocation's Ray and miso API (all in one block)."""

    block: int
    gcs: int
    client: int
    dashboard_agent: int
    dashboard_agent_grpc: int
    metrics: int
    node_manager: int
    object_manager: int
    runtime_env_agent: int
    api: int
    min_worker: int
    max_worker: int

    @classmethod
    def of_block(cls, block: int) -> RayPorts:
        if not 0 <= block < BLOCKS:
            raise ValueError(f"port block {block} is outside 0..{BLOCKS - 1}")
        base = PORT_BASE + block * BLOCK
        named = {name: base + i for i, name in enumerate(_NAMED)}
        return cls(block=block, min_worker=base + 10, max_worker=base + BLOCK - 1, **named)

    def named(self) -> dict[str, int]:
        """The single ports (not the worker range), by role."""
        return {name: getattr(self, name) for name in _NAMED}

    def node_local(self) -> dict[str, int]:
        """The ports every node binds (the head's GCS, client and API excepted)."""
        return {k: v for k, v in self.named().items() if k not in ("gcs", "client", "api")}

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RayPorts:
        return cls.of_block(int(data["block"]))


def first_block(job_id: int) -> int:
    """The block an allocation tries first."""
    if job_id < 0:
        raise ValueError(f"job id {job_id} is negative")
    return job_id % BLOCKS


def blocks_to_try(job_id: int) -> Iterator[int]:
    """Every block, the job's own first, then the following ones (wrapping)."""
    start = first_block(job_id)
    for i in range(BLOCKS):
        yield (start + i) % BLOCKS


def choose_ports(job_id: int, is_free: Callable[[int], bool]) -> RayPorts:
    """The first block (from the job's own) whose named ports are all free on this node.

    ``is_free(port)`` answers for one port. Raises RuntimeError when no block is free."""
    for b in blocks_to_try(job_id):
        ports = RayPorts.of_block(b)
        if all(is_free(p) for p in ports.named().values()):
            return ports
    raise RuntimeError(f"no free block of {BLOCK} ports in {PORT_BASE}..."
                       f"{PORT_BASE + BLOCKS * BLOCK - 1}")


def ray_start_args(ports: RayPorts, *, head: bool, address: str | None = None,
                   node_ip: str | None = None, temp_dir: str | None = None,
                   resources: dict[str, float] | None = None,
                   num_cpus: int | None = None, num_gpus: int | None = None,
                   taken: Callable[[int], bool] | None = None,
                   ray_client: bool = False) -> list[str]:
    """Arguments of ``ray start --block`` for one node of the allocation.

    The head binds the GCS and client ports; every node its node-local ports, except those
    ``taken(port)`` says another process holds on this node (Ray then picks a free one). With
    ``ray_client`` (``ray[client]`` installed: Ray would otherwise take its fixed 10001) the
    head's client server gets the allocation's port too."""
    if not head and not address:
        raise ValueError("a worker node needs the head's address")
    args = ["start", "--block", "--disable-usage-stats"]
    if head:
        args += ["--head", f"--port={ports.gcs}", "--include-dashboard=false"]
        if ray_client:
            args.append(f"--ray-client-server-port={ports.client}")
    else:
        args += [f"--address={address}"]
    flags = {"node_manager": "--node-manager-port", "object_manager": "--object-manager-port",
             "dashboard_agent": "--dashboard-agent-listen-port",
             "dashboard_agent_grpc": "--dashboard-agent-grpc-port",
             "metrics": "--metrics-export-port", "runtime_env_agent": "--runtime-env-agent-port"}
    for role, port in ports.node_local().items():
        if taken is None or not taken(port):
            args.append(f"{flags[role]}={port}")
    args += [f"--min-worker-port={ports.min_worker}", f"--max-worker-port={ports.max_worker}"]
    if node_ip:
        args.append(f"--node-ip-address={node_ip}")
    if temp_dir:
        args.append(f"--temp-dir={temp_dir}")
    if resources:
        args.append(f"--resources={json.dumps(resources, sort_keys=True)}")
    if num_cpus is not None:
        args.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        args.append(f"--num-gpus={num_gpus}")
    return args


def temp_dir_for(job_id: int, root: str = "/tmp") -> str:  # noqa: S108 - a private subdir
    """The private runtime dir of an allocation on each node (``miso node --temp-dir``
    creates it 0700 and gives Ray ``<it>/r``): short (Ray's socket paths must stay under 107
    bytes), the allocation's own, and unpredictable (job ids are sequential: another account
    must not be able to prepare it; one that exists and is not ours is refused)."""
    return f"{root.rstrip('/')}/miso-slurm-{job_id}-{secrets.token_hex(4)}"


_JOB_ID = re.compile(r"^[0-9]{1,12}$")


def job_id_from_env(env: dict[str, str]) -> int:
    """``SLURM_JOB_ID`` (``SLURM_JOBID`` on old Slurm) as an int; ValueError outside an
    allocation or for anything that is not a plain number."""
    raw = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not _JOB_ID.match(raw):
        raise ValueError("not inside a Slurm allocation (SLURM_JOB_ID is not set)" if not raw
                         else f"SLURM_JOB_ID {raw!r} is not a job number")
    return int(raw)


def srun_node_args(nodes: list[str], *, cpus_per_node: int | None = None,
                   gpus_per_node: int | None = None) -> list[str]:
    """``srun`` options for one task per node on ``nodes``: a step as long as the allocation
    (``--overlap``: it never blocks other steps), with the node's CPUs, memory and GPUs (a
    step gets one CPU and no GPU unless it asks; ``task/cgroup`` would confine Ray to them)
    and no CPU binding of its own."""
    if not nodes:
        raise ValueError("no nodes")
    args = [f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=0", "--overlap", "--mem=0"]
    if cpus_per_node:
        args += [f"--cpus-per-task={cpus_per_node}", "--cpu-bind=none"]
    if gpus_per_node:
        args.append(f"--gres=gpu:{gpus_per_node}")
    return args
