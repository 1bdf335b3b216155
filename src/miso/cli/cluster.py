"""``miso cluster up|down``: start and stop the controller, the agents and the HTTP API.

The lead mounts these on the main app as ``app.add_typer(cluster_app, name="cluster")``. The
job commands (``submit``, ``status``, ``logs``, ``cancel``) speak the HTTP API
(:mod:`miso.cli.client`); only ``up``/``down`` use Ray, with the cluster's Ray token
(:mod:`miso.raytoken`). The state directory is ``--state-dir``, ``$MISO_STATE_DIR`` or
``~/.miso/cluster`` (mode 0700).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from miso.cli.group import QuickHelpGroup
from miso.cli.text import fail, make_console, safe

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

cluster_app = typer.Typer(help="Start or stop a miso cluster (controller + agents on Ray).",
                          no_args_is_help=True, cls=QuickHelpGroup)
console = make_console()
err_console = make_console(stderr=True)

StateDir = Annotated[str | None, typer.Option(
    "--state-dir", help="Cluster state directory (default $MISO_STATE_DIR or ~/.miso/cluster).")]
Address = Annotated[str | None, typer.Option(
    "--address", help="Ray address of a running cluster ('auto' to find it).")]


def reachable(addr: str, timeout: float = 3.0) -> str | None:
    """None when something listens at ``host:port``, else why not (one line)."""
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        return None  # "auto" or a form Ray resolves itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as e:
        return f"{e.strerror or type(e).__name__}"


def _state_dir(state_dir: str | None) -> str:
    return str(Path(state_dir or os.environ.get("MISO_STATE_DIR")
                    or Path.home() / ".miso" / "cluster").expanduser().resolve())


ESTIMATORS = ("auto", "predictor", "heuristic", "true", "noisy")
#: Most emulated GPUs ``cluster up --emulated`` starts: every emulated GPU is an agent-side
#: object polled by the controller, and past about a thousand the local head no longer comes
#: up in reasonable time on one machine (100,000 hung it); real clusters are not bounded here.
MAX_EMULATED_GPUS = 1024


def _config(policy: str, profile_seconds: float, checkpoint_timeout: float,
            estimator: str) -> dict[str, Any]:
    from miso.sched import policy_names

    known = policy_names()
    if policy not in known:
        fail(f"unknown policy {policy!r}; known: {', '.join(known)}")
    if estimator not in ESTIMATORS:
        fail(f"unknown estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    for flag, v in (("--profile-seconds", profile_seconds),
                    ("--checkpoint-timeout", checkpoint_timeout)):
        if not (math.isfinite(v) and v > 0):
            fail(f"{flag} must be a positive number of seconds, got {v}")
    return {"policy": policy, "profile_seconds_per_level": profile_seconds,
            "checkpoint_timeout": checkpoint_timeout, "estimator": estimator}


def time_limit_action(text: str) -> str:
    """``--at-time-limit``: ``end`` or ``requeue`` (:attr:`ControllerConfig.time_limit_action
    <miso.controller.runtime.ControllerConfig.time_limit_action>`); one line otherwise."""
    from miso.controller.runtime import TIME_LIMIT_ACTIONS

    if text not in TIME_LIMIT_ACTIONS:
        fail(f"--at-time-limit {text!r}: expected {' or '.join(TIME_LIMIT_ACTIONS)}")
    return text


def tenancy_options(fair_share: bool, half_life: float | None, preempt: bool,
                    min_run_s: float | None, reclaim: bool = True,
                    demand_per_job: float | None = None,
                    stop_uncheckpointable_after: float | None = None,
                    fairness_price: float | None = None,
                    ) -> dict[str, Any] | None:
    """The controller's ``tenancy`` (:class:`miso.sched.tenancy.TenancyConfig` as JSON) from
    the ``--fair-share`` flags, or None (one FIFO queue; stored quotas still turn tenancy on)."""
    if half_life is not None and not fair_share:
        fail("--half-life needs --fair-share")
    if min_run_s is not None and not preempt:
        fail("--min-run-s needs --preempt")
    if not reclaim and not fair_share:
        fail("--no-reclaim needs --fair-share")
    if demand_per_job is not None and not fair_share:
        fail("--demand-per-job needs --fair-share")
    if demand_per_job is not None and not (math.isfinite(demand_per_job)
                                           and 0 < demand_per_job <= 1):
        fail(f"--demand-per-job must be in (0, 1], got {demand_per_job}")
    if half_life is not None and not (math.isfinite(half_life) and half_life > 0):
        fail(f"--half-life must be a positive number of seconds, got {half_life}")
    if min_run_s is not None and not (math.isfinite(min_run_s) and min_run_s >= 0):
        fail(f"--min-run-s must be a non-negative number of seconds, got {min_run_s}")
    if fairness_price is not None and not fair_share:
        fail("--fairness-price needs --fair-share")
    if fairness_price is not None and demand_per_job is not None:
        fail("--fairness-price and --demand-per-job: give one (a price lets fair slices "
             "follow the load; --demand-per-job fixes their cap)")
    if fairness_price is not None and not (math.isfinite(fairness_price)
                                           and 0 <= fairness_price <= 1):
        fail(f"--fairness-price must be a share from 0 to 1 (0.05: 5 %), got {fairness_price}")
    grace = stop_uncheckpointable_after
    if grace is not None and not (fair_share and reclaim):
        fail("--stop-uncheckpointable-after needs --fair-share (with reclaim)")
    if grace is not None and not (math.isfinite(grace) and grace >= 0):
        fail(f"--stop-uncheckpointable-after must be a non-negative number of seconds, got "
             f"{grace}")
    if grace is not None and min_run_s is not None:
        fail("--stop-uncheckpointable-after sets the minimum run time: give it alone")
    if not (fair_share or preempt):
        return None
    out: dict[str, Any] = {"fair_share": fair_share, "preempt": preempt}
    if grace is not None:  # fair share may stop (requeue) a job that cannot checkpoint
        out["preempt_uncheckpointable"] = True
        out["min_run_s"] = grace
    if half_life is not None:
        out["half_life_s"] = half_life
    if min_run_s is not None:
        out["min_run_s"] = min_run_s
    if not reclaim:
        out["reclaim"] = False
    if demand_per_job is not None:
        out["demand_per_job"] = demand_per_job
    elif fair_share:  # the price given, else the one the cluster's store keeps
        out["fairness_price"] = "stored" if fairness_price is None else fairness_price
    return out


#: How long ``cluster up`` waits for what a killed head left holding the state dir.
LEFTOVER_WAIT_S = 45.0


def wait_for_leftovers(sd: str, timeout: float, say: Callable[[str], object]) -> bool:
    """After a head was killed (its ``cluster.json`` names a head that is gone), its Ray
    processes (the controller holding ``controller.lock``) outlive it for seconds: say what
    is awaited and wait up to ``timeout`` for the locks to be free. True when they are (or
    no head was killed), False when something still holds them."""
    from miso import raycluster as rc
    from miso.controller.statelock import StateDirLock

    info = rc.read_cluster_file(sd)
    if info is None or rc.is_our_head(info, sd):
        return True
    locks = [(rc.head_lock(sd), "head"), (StateDirLock(sd), "controller")]
    held = [(what, lock.holder()) for lock, what in locks if lock.holder() is not None]
    if not held:
        return True
    names = ", ".join(f"its {what} (PID {pid})" for what, pid in held)
    say(f"the previous head of {sd} (PID {info.get('pid')}) is gone but {names} still "
        f"hold the state directory: waiting up to {timeout:.0f}s for them to exit")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(lock.holder() is None for lock, _ in locks):
            return True
        time.sleep(0.3)
    return False


def _check_state_dir(sd: str) -> None:
    """Refuse a state dir another live miso owns, or whose job store is damaged."""
    from miso import raycluster as rc
    from miso.controller.statelock import StateDirLock
    from miso.controller.storefile import store_problem

    freed = wait_for_leftovers(sd, LEFTOVER_WAIT_S, console.print)
    for lock, what in ((rc.head_lock(sd), "a miso cluster head"),
                       (StateDirLock(sd), "a miso controller")):
        pid = lock.holder()
        if pid is not None and not freed:
            fail(f"state directory {sd} is still held by PID {pid}, left by a head that was "
                 f"killed, {LEFTOVER_WAIT_S:.0f}s after it; end it (kill {pid}) and retry")
        if pid is not None:
            who = f"PID {pid}" if pid > 0 else "another process"
            fail(f"state directory {sd} is in use by {what} ({who}); stop it first "
                  f"(miso cluster down --state-dir {sd})")
    from miso.api.head import users_problem

    problem = store_problem(sd) or users_problem(sd)
    if problem:
        fail(problem)


# ---- cluster up / down ----------------------------------------------------------------------


def _read_config(ctx: typer.Context, _param: Any, value: str | None) -> str | None:
    """``--config FILE``: the file's values become the defaults of ``up``'s flags (a flag
    on the command line wins). Eager, so it is read before the other flags."""
    if not value:
        return value
    from miso.deploy.upconfig import ConfigError, read_up_config

    try:
        values = read_up_config(value)
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from None
    ctx.default_map = {**(ctx.default_map or {}), **values}
    return value


@cluster_app.command("up")
def up(
    config: Annotated[str | None, typer.Option(
        "--config", envvar="MISO_CLUSTER_CONFIG", is_eager=True, callback=_read_config,
        help="TOML file of cluster up's settings (policy, listen, tls-cert, tls-key, "
        "fair-share, ...; docs/deploy.md); flags given here win.  [env: "
        "MISO_CLUSTER_CONFIG]")] = None,
    emulated: Annotated[bool, typer.Option("--emulated", help="Emulated GPUs (no hardware).")]
    = False,
    gpus: Annotated[int, typer.Option(
        "--gpus", help=f"Emulated GPUs per node (1 to {MAX_EMULATED_GPUS}).")] = 4,
    gpu_model: Annotated[str, typer.Option("--gpu-model", help="Emulated GPU model.")]
    = "A100-40GB",
    address: Address = None,
    state_dir: StateDir = None,
    policy: Annotated[str, typer.Option(
        "--policy", help="Scheduling policy: miso+ (ours, default), miso (the paper's), "
        "oracle, optsta, mps or nopart.")] = "miso+",
    profile_seconds: Annotated[float, typer.Option(
        "--profile-seconds", help="MPS profiling seconds per level (the levels run as the "
        "policy asks with 100 % last: miso 50, 14, 100 %; miso+ 14, 100 %).")] = 10.0,
    checkpoint_timeout: Annotated[float, typer.Option(
        "--checkpoint-timeout", help="Seconds a job gets to checkpoint before it is killed.")]
    = 30.0,
    estimator: Annotated[str, typer.Option(
        "--estimator", help="Speed estimator: auto, predictor, heuristic, true or noisy.")]
    = "auto",
    listen: Annotated[str, typer.Option(
        "--listen", help="HOST:PORT of the HTTP API (default 127.0.0.1, a free port).")]
    = "127.0.0.1:0",
    tls_cert: Annotated[str | None, typer.Option(
        "--tls-cert", help="Serve the API over HTTPS with this certificate (PEM).")] = None,
    tls_key: Annotated[str | None, typer.Option(
        "--tls-key", help="Private key (PEM) of --tls-cert.")] = None,
    insecure: Annotated[bool, typer.Option(
        "--insecure", help="Allow plain HTTP on a non-loopback --listen address.")] = False,
    metrics_public: Annotated[bool, typer.Option(
        "--metrics-public", help="Serve /metrics without a token (default: any user's token; "
        "loopback is no exemption, every local account reaches it). Owners then read as "
        "'other'.")] = False,
    fair_share: Annotated[bool, typer.Option(
        "--fair-share", help="Tenancy with fair share: waiting jobs are placed by priority, "
        "then by their owner's decayed usage against its weight (`miso quota`), then FIFO.")]
    = False,
    half_life: Annotated[float | None, typer.Option(
        "--half-life", help="Half-life (s) of owners' usage under --fair-share.  [default: "
        "7 days, Slurm's PriorityDecayHalfLife]")] = None,
    preempt: Annotated[bool, typer.Option(
        "--preempt", help="A high-priority job that cannot be placed checkpoints and requeues "
        "the cheapest lower-priority jobs (never one that cannot checkpoint).")] = False,
    min_run_s: Annotated[float | None, typer.Option(
        "--min-run-s", help="With --preempt: a job is never preempted before it ran this "
        "long since its last start.  [default: 600]")] = None,
    reclaim: Annotated[bool, typer.Option(
        "--reclaim/--no-reclaim", help="With --fair-share: an owner below its entitlement gets "
        "fair slices, and room other owners borrowed is returned to it (their cheapest jobs "
        "checkpoint and requeue); --no-reclaim: fair share orders the queue only.")] = True,
    demand_per_job: Annotated[float | None, typer.Option(
        "--demand-per-job", help="With --fair-share: the most of a GPU one job's fair slice can "
        "be (0.5: a 3g slice on an A100; 1/3: 2g), fixed instead of --fairness-price.")]
    = None,
    fairness_price: Annotated[float | None, typer.Option(
        "--fairness-price", help="With --fair-share: the share of the total average JCT the "
        "cluster may pay for fairness (0.05: 5 %); fair slices follow the backlog within it. "
        "Kept in the cluster's store for its next starts.  [default: the kept one, else "
        "0.05]")] = None,
    stop_uncheckpointable_after: Annotated[float | None, typer.Option(
        "--stop-uncheckpointable-after", help="With --fair-share: a job that cannot "
        "checkpoint, of an owner above its entitlement, may be stopped and requeued (it loses "
        "its progress) for an owner below its own once it ran this many seconds (the minimum "
        "run time of every reclaim).  [default: never stopped]")] = None,
    at_time_limit: Annotated[str, typer.Option(
        "--at-time-limit", help="What happens to a job past its --time: end (checkpointed if "
        "it saves, then failed) or requeue (a job that saves is checkpointed and queued again, "
        "resuming from its checkpoint; its limit counts per run; one that cannot save ends).")
    ] = "end",
) -> None:
    """Start the controller and one agent per GPU node (settings from --config FILE too).

    One machine: ``miso cluster up --emulated --gpus 4`` starts a private local Ray with
    everything in it. Many machines: ``ray start`` on each node (GPU nodes with
    ``--resources '{"miso_agent": 1}'``), then ``miso cluster up --address auto``.
    """
    from miso import raycluster as rc
    from miso.mig import gpu_model as find_model

    del config  # read by its callback into the other flags' defaults
    sd = _state_dir(state_dir)
    try:
        model = find_model(gpu_model).name
    except KeyError as e:
        fail(str(e.args[0]))
    if gpus < 1:
        fail("--gpus must be at least 1")
    if emulated and gpus > MAX_EMULATED_GPUS:
        fail(f"--gpus {gpus}: at most {MAX_EMULATED_GPUS} emulated GPUs per node (each is "
             "polled by the controller; more do not come up on one machine)")
    cfg = _config(policy, profile_seconds, checkpoint_timeout, estimator)
    tenancy = tenancy_options(fair_share, half_life, preempt, min_run_s, reclaim,
                              demand_per_job, stop_uncheckpointable_after, fairness_price)
    if tenancy is not None:
        cfg["tenancy"] = tenancy
    cfg["time_limit_action"] = time_limit_action(at_time_limit)
    api = {**_api_listen(listen, tls_cert, tls_key, insecure),
           "metrics_public": metrics_public}
    _private_state_dir(sd)
    if address is None:
        if not emulated:
            fail("give --address for a Ray cluster with real GPUs, or --emulated")
        info = rc.read_cluster_file(sd)
        if info is not None and rc.is_our_head(info, sd):
            fail(f"a cluster already runs from {sd} (PID {info['pid']}); miso cluster down "
                  f"first")
        _check_state_dir(sd)
        rc.cluster_file(sd).unlink(missing_ok=True)  # stale: its head is gone
        operator = _bootstrap(sd)
        err_console.print(f"miso cluster up: starting a local Ray head, the controller "
                          f"({policy}) and {gpus} emulated GPU agent(s)...")
        try:
            info = rc.spawn_local_head(sd, gpus=gpus, model=model, config=cfg, api=api)
        except RuntimeError as e:
            fail(str(e))
        console.print(f"miso cluster up: {gpus} emulated {model} GPUs, Ray at "
                      f"{info['address']}, state in {safe(sd)}")
        _print_api(info.get("api_url"), operator, sd)
        return
    _check_state_dir(sd)
    why = reachable(address)
    if why is not None:
        fail(f"cannot reach Ray at {address}: {why}")
    _ray_auth(sd)
    err_console.print(f"miso cluster up: connecting to Ray at {address}...")
    try:
        rc.connect(address)
    except Exception as e:  # noqa: BLE001 - Ray raises many kinds here
        fail(f"cannot connect to Ray at {address} (token auth on: RAY_AUTH_MODE=token and "
              f"the cluster's token in RAY_AUTH_TOKEN_PATH): {e}")
    operator = _bootstrap(sd)
    import ray

    backend = {"kind": "emulated", "gpus": gpus, "model": model} if emulated \
        else {"kind": "nvml"}
    err_console.print("miso cluster up: starting the agents...")
    nodes = rc.start_agents(backend, str(Path(sd) / "agents"))
    if not nodes:
        fail("no Ray node offers the 'miso_agent' resource or a GPU")
    err_console.print(f"miso cluster up: agents on {', '.join(nodes)}; starting the "
                      f"controller ({policy}) and the API...")
    try:
        h = rc.start_controller(sd, cfg, api)
    except RuntimeError as e:
        fail(str(e))
    url = ray.get(h.api_url.remote(), timeout=60)
    rc.cluster_file(sd).write_text(json.dumps({
        "address": ray.get_runtime_context().gcs_address, "pid": 0, "state_dir": sd,
        "nodes": nodes, "emulated": emulated, "api_url": url}))
    console.print(f"miso cluster up: controller + agents on {', '.join(nodes)}")
    _print_api(url, operator, sd)


def _api_listen(listen: str, cert: str | None, key: str | None, insecure: bool
                ) -> dict[str, Any]:
    from miso.api.server import ListenError, parse_listen

    try:
        lst = parse_listen(listen, tls_cert=cert, tls_key=key, insecure=insecure)
    except ListenError as e:
        fail(str(e))
    for f in (lst.tls_cert, lst.tls_key):
        if f is not None and not Path(f).is_file():
            fail(f"no such file: {f}")
    return {"host": lst.host, "port": lst.port,
            "tls_cert": str(Path(lst.tls_cert).resolve()) if lst.tls_cert else None,
            "tls_key": str(Path(lst.tls_key).resolve()) if lst.tls_key else None}


def _ray_auth(sd: str) -> None:
    """Ray's token auth on, with the state dir's token unless one is configured already."""
    from miso import raytoken

    os.environ["RAY_AUTH_MODE"] = "token"  # never without it
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH") \
            and raytoken.token_file(sd).exists():
        raytoken.use(raytoken.token_file(sd))


def _private_state_dir(sd: str) -> None:
    Path(sd).mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(sd, 0o700)


def _bootstrap(sd: str) -> str | None:
    from miso.api.head import bootstrap_operator

    return bootstrap_operator(sd)


def _print_api(url: str | None, operator: str | None, sd: str) -> None:
    console.print(f"miso API at {url}")
    if operator:
        console.print(f"you are its first admin, {operator!r} (token in "
                      f"{Path(sd) / 'operator.token'}); add users with `miso user add`")


@cluster_app.command("down")
def down(state_dir: StateDir = None, address: Address = None) -> None:
    """Stop every job, the controller and the agents (and the local Ray this CLI started)."""
    from miso import raycluster as rc

    sd = _state_dir(state_dir)
    f = rc.cluster_file(sd)
    info = rc.read_cluster_file(sd) or {}
    if info.get("pid"):
        if rc.stop_local_head(sd):
            console.print("miso cluster down: local cluster stopped")
        else:
            console.print(f"miso cluster down: no cluster runs from {safe(sd)} (PID "
                          f"{info['pid']} is not its head; stale cluster.json removed)")
        return
    addr = address or info.get("address") or os.environ.get("RAY_ADDRESS")
    if not addr:
        console.print(f"miso cluster down: no cluster runs from {safe(sd)}; nothing to stop")
        return
    _ray_auth(sd)
    rc.connect(addr)
    rc.stop_actors(stop_jobs=True)
    f.unlink(missing_ok=True)
    console.print("miso cluster down: controller and agents stopped")
