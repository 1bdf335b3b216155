"""The demo: an emulated job stream, its clusters (in-process or a private local Ray) and its
summary. The ``miso demo`` command is :mod:`miso.cli.demo`."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

from miso.jobstatus import JobStatus

#: Workloads of the demo stream: small training jobs from the A100 table that cannot fill a
#: GPU (the case MIG sharing is for). On a mix with large jobs the compressed time-scale (a
#: restart costs a 20 s job ~4 s here) eats the gain; see benchmarks/README.md, Live system.
DEMO_WORKLOADS = ("mobilenet_train64", "mobilenet_train128", "mobilenet_train256",
                  "resnet_train64", "resnet_train128", "embedding_train64", "embedding_train128",
                  "gnn_train64")


#: Restart cost of the demo's emulated jobs (s): the warm-up of every start after the first.
DEMO_RESTART_S = 2.0


def demo_jobs(n: int, seed: int = 0, *, ips: float = 20.0, mean_work_s: float = 20.0,
              spread_s: float = 20.0, restart_s: float = DEMO_RESTART_S,
              ) -> list[tuple[float, str, list[str]]]:
    """``n`` (arrival time, name, command) of emulated jobs: ~``mean_work_s`` of full-GPU work
    each (at least 10x one 1 s profiling level), arriving over ``spread_s`` seconds, each
    restart costing ``restart_s`` of warm-up. Deterministic per seed."""
    from miso.workloads import catalogue

    cat = catalogue()
    missing = [w for w in DEMO_WORKLOADS if w not in cat]
    if missing:
        raise ValueError(f"demo workloads not in the catalogue: {', '.join(missing)}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        wl = DEMO_WORKLOADS[rng.randrange(len(DEMO_WORKLOADS))]
        work = mean_work_s * rng.uniform(0.5, 1.5)
        at = spread_s * i / max(1, n - 1) if n > 1 else 0.0
        cmd = [sys.executable, "-m", "miso.emuworkload", "--workload", wl,
               "--iterations", str(int(work * ips)), "--ips", str(ips),
               "--restart-s", f"{restart_s:g}"]
        out.append((at, f"demo-{i:02d}-{wl}", cmd))
    return out


def demo_trace(stream: list[tuple[float, str, list[str]]]) -> list[Any]:
    """The demo stream as a simulator trace (:class:`~miso.sim.traces.TraceJob`: arrival,
    full-GPU work, workload), to find OptSta's static layout the way the simulator does or
    to replay the stream in the simulator."""
    from miso.sim.traces import TraceJob

    out = []
    for at, name, cmd in stream:
        wl = cmd[cmd.index("--workload") + 1]
        work = float(cmd[cmd.index("--iterations") + 1]) / float(cmd[cmd.index("--ips") + 1])
        out.append(TraceJob(name, at, work, wl))
    return out


def policy_args(policy: str, stream: list[tuple[float, str, list[str]]], gpus: int,
                model: str) -> dict[str, Any]:
    """The options the demo gives ``policy``: OptSta gets the best static layout for the
    stream (the simulator's offline search, :func:`miso.sim.run.optsta_search`: without one
    it would run one whole-GPU instance, i.e. NoPart). miso+ is not told the jobs' restart
    cost: it measures it. Raises ValueError when no static layout runs the stream."""
    if policy != "optsta":
        return {}
    from miso.sim.run import optsta_search
    from miso.sim.world import WorldConfig

    cfg = WorldConfig(gpu_model=model, n_gpus=gpus, restart_s=DEMO_RESTART_S,
                      profile_s_per_level=1.0)
    try:
        return {"layout": tuple(optsta_search(demo_trace(stream), cfg, seed=1))}
    except RuntimeError as e:
        raise ValueError(f"optsta cannot run this stream: {e}") from None


def summarize(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"completed", "failed", "avg_jct_s", "makespan_s", "restarts", "restarts_per_job"}``
    of a finished stream."""
    done = [j for j in jobs if j["state"] == JobStatus.FINISHED]
    jct = [j["ended_at"] - j["submitted_at"] for j in done if j.get("ended_at") is not None]
    ends = [j["ended_at"] for j in jobs if j.get("ended_at") is not None]
    start = min((j["submitted_at"] for j in jobs), default=0.0)
    return {
        "completed": len(done),
        "failed": sum(j["state"] in (JobStatus.FAILED, JobStatus.CANCELLED,
                                                JobStatus.OVER_LIMIT) for j in jobs),
        "avg_jct_s": round(sum(jct) / len(jct), 2) if jct else None,
        "makespan_s": round(max(ends) - start, 2) if ends else None,
        "restarts": sum(int(j.get("restarts") or 0) for j in jobs),
        "restarts_per_job": round(sum(int(j.get("restarts") or 0) for j in jobs)
                                  / max(1, len(jobs)), 3),
    }


class DemoLocal:
    """The demo cluster without Ray (in-process agents and controller)."""

    def __init__(self, d: str, gpus: int, model: str, cfg: dict[str, Any]) -> None:
        from miso.cluster.local import LocalCluster
        from miso.controller import ControllerConfig

        self.c = LocalCluster(d, gpus_per_node=gpus, model=model,
                              config=ControllerConfig(**cfg))

    def submit(self, cmd: list[str], name: str) -> str:
        assert self.c.controller is not None
        return self.c.controller.submit(cmd, name=name)

    def status(self) -> dict[str, Any]:
        assert self.c.controller is not None
        return self.c.controller.status()

    def close(self) -> None:
        self.c.close()


class DemoRay:
    """The demo cluster in a private local Ray started by this process."""

    def __init__(self, d: str, gpus: int, model: str, cfg: dict[str, Any]) -> None:
        from miso import raycluster as rc

        self.rc = rc
        self.key = d
        rc.init_local(key=d)
        rc.start_agents({"kind": "emulated", "gpus": gpus, "model": model},
                        str(Path(d) / "agents"), names=["node0"])
        self.h = rc.start_controller(d, cfg)

    def submit(self, cmd: list[str], name: str) -> str:
        import ray

        res = ray.get(self.h.submit.remote(cmd, name), timeout=60)
        if not res["ok"]:
            raise RuntimeError(res["error"])
        return str(res["id"])

    def status(self) -> dict[str, Any]:
        import ray

        return dict(ray.get(self.h.status.remote(), timeout=60))

    def close(self) -> None:
        import ray

        try:
            self.rc.stop_actors(stop_jobs=True)
        finally:
            ray.shutdown()
            self.rc.remove_local_temp()


