"""Starting, finding, checkpointing and stopping miso's Ray actors in a running Ray.

Agent actors are supervised by Ray (``max_restarts=-1``, no task retried): a killed or crashed
agent comes back by itself as a new incarnation (see :mod:`miso.raycluster`). The actors
themselves are :mod:`miso.cluster.rayactors`, their names :mod:`miso.transport.ray`.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any

from miso.attemptstatus import AttemptStatus
from miso.cluster.rayactors import AgentActor, ControllerActor
from miso.transport.ray import AGENT_PREFIX, AGENT_RESOURCE, CONTROLLER, NAMESPACE

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _ray() -> Any:
    import ray  # noqa: PLC0415

    return ray


def agent_nodes() -> list[dict[str, Any]]:
    """Alive Ray nodes that should run an agent (``miso_agent`` resource, else ``GPU``)."""
    ray = _ray()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    tagged = [n for n in alive if n.get("Resources", {}).get(AGENT_RESOURCE, 0) >= 1]
    return tagged or [n for n in alive if n.get("Resources", {}).get("GPU", 0) > 0]


_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")


def agent_name(node: dict[str, Any]) -> str | None:
    """The short host name of a Ray node, when it is a plain host name (used in paths)."""
    host = str(node.get("NodeManagerHostname") or "").split(".")[0]
    return host if _HOST.match(host) else None


def start_agents(backend: dict[str, Any], workdir: str, *, names: list[str] | None = None,
                 rate_window: float = 1.0, change_threshold: float = 0.25) -> list[str]:
    """Start one detached agent actor on every agent node; returns the node names."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

    cls = ray.remote(AgentActor)
    out = []
    def order(n: dict[str, Any]) -> tuple[bool, str]:  # the head node first
        return ("node:__internal_head__" not in n.get("Resources", {}), n["NodeID"])

    found = sorted(agent_nodes(), key=order)
    hosts = [agent_name(n) for n in found]
    for i, n in enumerate(found):
        # a host's name when it runs one node (stable across restarts: a new Ray on the same
        # host finds its jobs' records, e.g. the next Slurm allocation), else the node's id
        name = names[i] if names and i < len(names) else \
            hosts[i] if hosts[i] and hosts.count(hosts[i]) == 1 else f"node-{n['NodeID'][:8]}"
        res = {AGENT_RESOURCE: 1} if n.get("Resources", {}).get(AGENT_RESOURCE) else {}
        h = cls.options(
            name=AGENT_PREFIX + name, namespace=NAMESPACE, lifetime="detached",
            get_if_exists=True, num_cpus=0, resources=res, max_concurrency=16,
            max_restarts=-1, max_task_retries=0,  # supervised; no call is ever run twice
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote(name, backend, str(Path(workdir) / name), rate_window, change_threshold)
        ray.get(h.ping.remote(), timeout=120)
        out.append(name)
    return out


def start_controller(state_dir: str, config: dict[str, Any] | None = None,
                     api: dict[str, Any] | None = None) -> Any:
    """Start (or find) the detached controller actor, pinned to this node; with ``api`` (the
    :class:`miso.api.server.Listen` fields) it serves the HTTP API too."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

    here = ray.get_runtime_context().get_node_id()
    h = ray.remote(ControllerActor).options(
        name=CONTROLLER, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        num_cpus=0, max_restarts=-1, max_concurrency=8,
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
    ).remote(state_dir, config or {}, api)
    answer = ray.get(h.ping.remote(), timeout=120)
    if answer != "ok":
        ray.kill(h, no_restart=True)
        raise RuntimeError(answer)
    return h


def controller() -> Any:
    """Handle of the running controller actor (raises ValueError when there is none)."""
    return _ray().get_actor(CONTROLLER, namespace=NAMESPACE)


def agent_handles() -> list[Any]:
    """Handles of every agent actor of the ``miso`` namespace."""
    ray = _ray()
    from ray.util import list_named_actors  # noqa: PLC0415

    out = []
    for n in list_named_actors(all_namespaces=True):
        name, ns = (n["name"], n["namespace"]) if isinstance(n, dict) else (n, NAMESPACE)
        if ns == NAMESPACE and name.startswith(AGENT_PREFIX):
            try:
                out.append(ray.get_actor(name, namespace=NAMESPACE))
            except ValueError:
                continue
    return out


def checkpoint_jobs(timeout: float) -> int:
    """Halt the controller, ask every running job on every node to save and exit, and wait
    up to ``timeout`` s; returns how many still run without having saved since the request
    (:func:`stop_actors` kills those; a job that saved and is still exiting counts as saved).
    The store does not see these saves; the next controller on the state directory resumes
    the jobs from the helper's records of them (:mod:`miso.controller.recovery`)."""
    ray = _ray()
    with contextlib.suppress(Exception):  # no controller: nothing schedules anyway
        ray.get(controller().halt.remote(), timeout=30)
    agents = agent_handles()
    deadline = time.time() + timeout
    lease = deadline + 5  # the guards must not fence a job while it saves

    def running() -> list[dict[str, Any]]:
        out = []
        for a in agents:
            try:
                rep = ray.get(a.report.remote(lease), timeout=10)
            except Exception:  # noqa: BLE001, S112 - a lost node runs nothing we can save
                continue
            out += [j for j in rep["jobs"] if j["status"] == AttemptStatus.RUNNING]
        return out

    asked = {}
    for a in agents:
        try:
            jobs = [j for j in ray.get(a.report.remote(lease), timeout=10)["jobs"]
                    if j["status"] == AttemptStatus.RUNNING]
        except Exception:  # noqa: BLE001, S112
            continue
        for j in jobs:
            try:
                ray.get(a.checkpoint.remote(j["job"], j["attempt"]), timeout=10)
            except Exception:  # noqa: BLE001, S112
                continue
            asked[(j["job"], j["attempt"])] = j.get("checkpoint_iteration")
    left = unsaved(asked, running())
    while left and time.time() < deadline:
        time.sleep(0.2)
        left = unsaved(asked, running())
    return left


def unsaved(asked: dict[tuple[str, int], Any], running: list[dict[str, Any]]) -> int:
    """How many of the ``running`` attempts have not saved since they were asked to
    (``asked``: attempt -> its ``checkpoint_iteration`` then). A job whose checkpoint moved
    on has saved, even while it is still exiting."""
    n = 0
    for j in running:
        key = (j["job"], j["attempt"])
        ck = j.get("checkpoint_iteration")
        if key in asked and ck is not None and ck != asked[key]:
            continue
        n += 1
    return n


def stop_actors(*, stop_jobs: bool = True) -> None:
    """Stop jobs, then kill the controller and agent actors of the ``miso`` namespace."""
    ray = _ray()
    from ray.util import list_named_actors  # noqa: PLC0415

    try:
        h = controller()
        if stop_jobs:
            ray.get(h.shutdown.remote(), timeout=60)
        ray.kill(h, no_restart=True)
    except Exception:  # noqa: BLE001, S110 - no controller: nothing to stop
        pass
    for n in list_named_actors(all_namespaces=True):
        name, ns = (n["name"], n["namespace"]) if isinstance(n, dict) else (n, NAMESPACE)
        if ns == NAMESPACE and name.startswith(AGENT_PREFIX):
            try:
                a = ray.get_actor(name, namespace=NAMESPACE)
                if stop_jobs:
                    ray.get(a.shutdown.remote(), timeout=60)
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001, S110
                pass
