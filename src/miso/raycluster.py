"""miso on Ray: the controller is a named detached actor, each GPU node runs one agent actor.

* Agent actors (``miso-agent:<node>``, namespace ``miso``) are pinned to their node with a
  node-affinity strategy and take one unit of the custom resource ``miso_agent`` (so at most one
  per node). They are supervised by Ray (``max_restarts=-1``, no task retried): a killed or
  crashed agent comes back by itself as a new *incarnation*; the guards of its jobs killed them
  when the old agent died, and the controller, seeing the new incarnation, fences the node and
  requeues its jobs before using it again (:mod:`miso.controller.poller`). Nodes offer that
  resource when started with ``ray start ... --resources '{"miso_agent": 1}'``; if no node
  offers it, every node with a ``GPU`` resource gets an agent.
* The controller actor (``miso-controller``) is detached and restarts after a crash
  (``max_restarts=-1``); it is pinned to the node that holds its state directory and recovers from
  its SQLite store on every start.
* ``miso cluster up --emulated`` runs a private local Ray head inside a small supervisor process
  (``python -m miso.raycluster head ...``) that owns it: ``miso cluster down`` signals that
  process, which stops the jobs and shuts its Ray down. Nothing else on the machine is touched.

All Ray traffic stays on 127.0.0.1 for local clusters; no dashboard, no usage stats.

This module starts and stops Ray itself (a private local head, or joining a running Ray). The
actors are :mod:`miso.cluster.rayactors`, starting and stopping them :mod:`miso.cluster.raystart`;
their names are re-exported here, the one facade that the CLI, deploy scripts, tests and
benchmarks use (``from miso import raycluster as rc``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from miso import runtimedir
from miso.cluster.rayactors import AgentActor, ControllerActor, make_backend
from miso.cluster.raystart import (
    agent_handles,
    agent_name,
    agent_nodes,
    checkpoint_jobs,
    controller,
    start_agents,
    start_controller,
    stop_actors,
)
from miso.transport.ray import AGENT_PREFIX, AGENT_RESOURCE, CONTROLLER, NAMESPACE

__all__ = [
    # the head (this module)
    "HEAD_MARK", "cluster_file", "connect", "head_lock", "init_local", "is_our_head",
    "local_agent_pids", "main", "private_temp_dir", "process_start", "read_cluster_file",
    "remove_local_temp", "running", "spawn_local_head", "stop_local_head",
    # the actors and their supervision, re-exported (see the module docstring)
    "AGENT_PREFIX", "AGENT_RESOURCE", "CONTROLLER", "NAMESPACE", "AgentActor",
    "ControllerActor", "agent_handles", "agent_name", "agent_nodes", "checkpoint_jobs",
    "controller", "make_backend", "start_agents", "start_controller", "stop_actors",
]

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

#: Ray's settings every Ray process miso starts must have (inherited through the environment
#: by the raylet and its workers). By default a Ray worker that exits SIGKILLs its child
#: processes: an agent actor dying with its head (a SIGKILL of the head's process group) took
#: every guard of its node with it, at once, so no guard could end its job, and the orphaned
#: jobs ran on beside the attempts the next cluster launched (issue 26, item 2). Each guard
#: ends its own job when its agent is gone (:mod:`miso.agent.guard`), and only it can.
RAY_ENV = {"RAY_kill_child_processes_on_worker_exit": "0"}
os.environ.update(RAY_ENV)


def _ray() -> Any:
    import ray  # noqa: PLC0415

    return ray


def _local_only() -> None:
    """Keep Ray on the loopback interface (must run before ``ray`` is imported).

    Ray otherwise resolves 127.0.0.1 to the machine's outward IP; this switch (Ray's own, for
    single-machine clusters) makes every component bind and advertise 127.0.0.1.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # Ray's token authentication is always on (miso.raytoken): the head, its workers and the
    # operator's CLI share the cluster's token; nothing else on the machine reaches its Ray.
    from miso import raytoken  # noqa: PLC0415

    raytoken.ensure_env()
    if "ray" in sys.modules:
        from ray._private import ray_constants  # noqa: PLC0415

        ray_constants.ENABLE_RAY_CLUSTER = False


def private_temp_dir() -> str:
    """A Ray temp dir of our own, fresh for each start: ``<mkdtemp 0700>/r`` (never Ray's
    default ``/tmp/ray``, nor a name reused or predictable, which another account could have
    prepared; Ray makes the dir it gets 0777, so it gets one inside a private dir)."""
    return runtimedir.ray_temp_dir(runtimedir.fresh_private("miso-ray-"))


_started_temp: list[str] = []


def init_local(num_cpus: int | None = None, *, resources: dict[str, float] | None = None,
               key: str = "") -> str:
    """Start a new private local Ray on 127.0.0.1 (no dashboard, no usage stats), even when
    another Ray runs on this machine, in a fresh private temp dir (removed by
    :func:`remove_local_temp` after ``ray.shutdown()``); returns its address. ``key`` is
    kept for callers; the temp dir no longer depends on it."""
    del key
    _local_only()
    ray = _ray()
    temp = private_temp_dir()
    _started_temp.append(str(Path(temp).parent))
    ray.init(address="local", num_cpus=num_cpus or max(2, os.cpu_count() or 2),
             include_dashboard=False, _node_ip_address="127.0.0.1", namespace=NAMESPACE,
             log_to_driver=False, resources={AGENT_RESOURCE: 1, **(resources or {})},
             configure_logging=False, _temp_dir=temp)
    return str(ray.get_runtime_context().gcs_address)


def remove_local_temp() -> None:
    """Remove the private temp dirs :func:`init_local` made in this process (after
    ``ray.shutdown()``)."""
    while _started_temp:
        shutil.rmtree(_started_temp.pop(), ignore_errors=True)


def connect(address: str) -> None:
    """Connect this process to a running Ray cluster."""
    if address.split(":")[0] in ("127.0.0.1", "localhost"):
        _local_only()
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 configure_logging=False)


# ---- the local head supervisor (``miso cluster up --emulated``) -----------------------------


def cluster_file(state_dir: str | Path) -> Path:
    return Path(state_dir) / "cluster.json"


HEAD_MARK = "miso.raycluster"


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks since boot, from /proc), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def is_our_head(info: dict[str, Any], state_dir: str) -> bool:
    """True when ``cluster.json``'s PID is alive and is the head supervisor of ``state_dir``
    that wrote it (same start time, our command line), not a reused PID."""
    pid = int(info.get("pid") or 0)
    if pid <= 0:
        return False
    start = process_start(pid)
    if start is None or (info.get("pid_start") is not None and start != info["pid_start"]):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return HEAD_MARK.encode() in argv and b"head" in argv and \
        os.fsencode(str(state_dir)) in argv


def head_lock(state_dir: str | Path) -> Any:
    """The lock a local head supervisor holds on its state directory."""
    from miso.controller.statelock import StateDirLock  # noqa: PLC0415

    return StateDirLock(state_dir, "head.lock", "a miso cluster head")


def spawn_local_head(state_dir: str, *, gpus: int, model: str, config: dict[str, Any],
                     api: dict[str, Any] | None = None, timeout: float = 180.0
                     ) -> dict[str, Any]:
    """Start the supervisor process in its own session; wait for its ``cluster.json``.
    Raises RuntimeError with the head's one-line error when it does not come up."""
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    log = open(os.open(Path(state_dir) / "head.log",  # noqa: SIM115 - handed to the child
                       os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "miso.raycluster", "head", "--state-dir", state_dir,
         "--gpus", str(gpus), "--model", model, "--config", json.dumps(config),
         "--api", json.dumps(api if api is not None else {})],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    log.close()
    # recorded before it is up: `cluster down` stops it even when this `up` fails or hangs
    _write_cluster_file(state_dir, {"pid": proc.pid, "pid_start": process_start(proc.pid),
                                    "state_dir": state_dir, "starting": True})
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = read_cluster_file(state_dir)
        if info is not None and info.get("pid") == proc.pid and not info.get("starting"):
            return info
        if proc.poll() is not None:
            cluster_file(state_dir).unlink(missing_ok=True)
            raise RuntimeError(_head_error(state_dir) or
                               f"the local Ray head exited with {proc.returncode}; see "
                               f"{Path(state_dir) / 'head.log'}")
        time.sleep(0.3)
    stop_local_head(state_dir, timeout=20.0)
    raise RuntimeError(f"the local Ray head did not come up within {timeout:.0f}s (stopped); "
                       f"see {Path(state_dir) / 'head.log'}")


def _write_cluster_file(state_dir: str | Path, info: dict[str, Any]) -> None:
    tmp = cluster_file(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, cluster_file(state_dir))


def read_cluster_file(state_dir: str | Path) -> dict[str, Any] | None:
    """``cluster.json`` of ``state_dir``, or None when missing or unreadable."""
    try:
        data = json.loads(cluster_file(state_dir).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _head_error(state_dir: str) -> str:
    """The last ``error:`` line the head wrote to ``head.log``."""
    try:
        lines = (Path(state_dir) / "head.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errs = [ln[len("error: "):] for ln in lines if ln.startswith("error: ")]
    return errs[-1] if errs else ""


def stop_local_head(state_dir: str, timeout: float = 60.0) -> bool:
    """Signal the supervisor of ``state_dir`` and wait for it to exit. False (and a stale
    ``cluster.json`` removed) when no head of ours runs: a PID that is not our head is never
    signalled."""
    f = cluster_file(state_dir)
    info = read_cluster_file(state_dir)
    if info is None:
        return False
    pid = int(info.get("pid", 0))
    if not is_our_head(info, state_dir):
        f.unlink(missing_ok=True)
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        f.unlink(missing_ok=True)
        return False
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not running(pid):
            break
        time.sleep(0.3)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if info.get("starting"):  # it died before its Ray was up: end what it had started
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    f.unlink(missing_ok=True)
    return True


def running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not reaped, is not running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def local_agent_pids(state_dir: str | Path) -> list[int]:
    """PIDs of the agent actor processes of the local head of ``state_dir`` (its descendants
    titled ``ray::AgentActor``), from /proc: what an operator (or a fault benchmark) kills."""
    info = read_cluster_file(state_dir)
    if info is None or not is_our_head(info, str(state_dir)):
        return []
    head = int(info["pid"])
    parent: dict[int, int] = {}
    agents = []
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e.name}/stat").read_text()
            argv = Path(f"/proc/{e.name}/cmdline").read_bytes()
        except OSError:
            continue
        parent[int(e.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        if argv.startswith(b"ray::AgentActor"):
            agents.append(int(e.name))
    out = []
    for pid in agents:
        p, seen = pid, 0
        while p > 1 and p != head and seen < 64:
            p, seen = parent.get(p, 0), seen + 1
        if p == head:
            out.append(pid)
    return sorted(out)


def _head_main(a: argparse.Namespace) -> int:
    from miso.controller.statelock import StateDirLocked  # noqa: PLC0415

    stop = {"flag": False}

    def on_term(*_: object) -> None:
        stop["flag"] = True

    try:
        lock = head_lock(a.state_dir).acquire()
    except StateDirLocked as e:
        print(f"error: {e}", flush=True)
        return 3
    from miso import raytoken  # noqa: PLC0415

    os.umask(0o077)  # private state (Ray's session files, logs, jobs' directories)
    raytoken.use_state_dir(a.state_dir)  # Ray's token auth with the cluster's own token
    # until Ray is up a signal just ends this process (nothing runs yet)
    address = init_local(resources=None, key=a.state_dir)
    # ray.init installs its own SIGTERM handler: ours goes after it, or `cluster down` would
    # skip stopping the jobs
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        workdir = str(Path(a.state_dir) / "agents")
        start_agents({"kind": "emulated", "gpus": a.gpus, "model": a.model}, workdir,
                     names=["node0"])
        h = start_controller(a.state_dir, json.loads(a.config), json.loads(a.api))
        api_url = _ray().get(h.api_url.remote(), timeout=60)
    except Exception as e:  # noqa: BLE001 - reported to `cluster up` as one line
        print(f"error: {e}", flush=True)
        stop_actors(stop_jobs=True)
        _ray().shutdown()
        remove_local_temp()
        return 3
    info = {"address": address, "pid": os.getpid(), "pid_start": process_start(os.getpid()),
            "state_dir": a.state_dir, "host": socket.gethostname(), "gpus": a.gpus,
            "model": a.model, "emulated": True, "api_url": api_url}
    _write_cluster_file(a.state_dir, info)
    while not stop["flag"]:
        time.sleep(0.3)
    stop_actors(stop_jobs=True)
    _ray().shutdown()
    remove_local_temp()
    cluster_file(a.state_dir).unlink(missing_ok=True)
    lock.release()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m miso.raycluster")
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("head", help="run a private local Ray head with an emulated cluster")
    h.add_argument("--state-dir", required=True)
    h.add_argument("--gpus", type=int, default=4)
    h.add_argument("--model", default="A100-40GB")
    h.add_argument("--config", default="{}")
    h.add_argument("--api", default="{}", help="listen address of the HTTP API (JSON)")
    a = ap.parse_args(argv)
    return _head_main(a)


if __name__ == "__main__":
    sys.exit(main())
