"""Issue 26's attacks for ``benchmarks/security/run.py`` (loaded by it like
``control_plane.py``), each run once per trial with real, throw-away Unix accounts:

    python benchmarks/security/run.py --suite issue26 --trials 5 --json trust.json

The node attacks of :mod:`bounds_attacks` (next to this file), one account per trial:
``temp-dir-symlink``, ``slurm-precreated``, ``fork-to-limit``, ``memory-hog``, ``disk-fill``,
``checkpoint-dir-symlink`` (counts ``root_writes``, ``unstopped``, ``leaks``), and
``baseline-old-temp-dir`` (the symlink attack on the layout before issue 26: its
``baseline_root_writes`` must be one per trial, or the attack is not real).

The scheduling attacks, on an emulated cluster of 2 GPUs in this process (the controller, the
real agent and guard, the API app), users mapped to real accounts:

* ``quota-overrun``: an admin ``PUT /quotas/U {"max_in_use": 0.5}``; U submits 3 jobs on the
  idle cluster; U's ``in_use`` in the status ``owners`` is sampled every 20 ms while they run.
  ``quota_overruns``: trials where a sample was above 0.5 (``in_use_peak``: the peak).
* ``noncheckpointing-hold``: fair share with the operator's ``--stop-uncheckpointable-after 2``
  (``preempt_uncheckpointable``, ``min_run_s`` 2 s); owner H's 4 jobs that never checkpoint
  (``sleep 600``) hold both GPUs; then owner L submits one job. ``held``: trials where L's job
  had not finished 60 s later (``l_wait_s``: its submission to its end). The same without
  the setting, ``baseline-noncheckpointing-hold``: L's job must still wait 20 s later
  (``baseline_held`` one per trial), or the attack is not real.
* ``hostile-weight``: ``PUT /quotas/eve`` with the weights 5e-324, 1e6, -0.0, "2", true
  (``accepted_hostile``: answers other than 422), then the extremes allowed (eve 1e-3, bob 1e3)
  and a ``/bin/true`` job of each: ``loop_deaths`` counts trials where ``/healthz`` was not
  200 ``ok``, the loop thread died, or a job did not finish within 60 s; ``errors_shown``
  counts loop errors the status shows (an error is reported, never silent).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
USER_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
CFG: dict[str, Any] = {"profile_seconds_per_level": 0.3, "profile_warmup_s": 0.15,
                       "checkpoint_timeout": 3.0, "poll_interval": 0.1, "lease_s": 2.0}
Attack = Callable[[Any], dict[str, Any]]


def _bounds() -> Any:
    """benchmarks/security/bounds_attacks.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "miso_security_bounds", Path(__file__).with_name("bounds_attacks.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _with_account(fn: Callable[[Any], dict[str, Any]], rename: dict[str, str] | None = None
                  ) -> Attack:
    """A bounds attack ``fn(account)`` as an attack of ``run.py`` (``fn(env)``)."""
    def attack(env: Any) -> dict[str, Any]:
        with env.account("misoatk") as acct:
            got = fn(acct)
        names = {"stop_s_max": "stop_s", **(rename or {})}
        return {names.get(k, k): v for k, v in got.items()}
    return attack


# ---- a controller, its API and accounts ---------------------------------------------------

def _emu(seconds: float, ips: float = 20.0) -> list[str]:
    return [USER_PYTHON, "-m", "miso.emuworkload", "--workload", "resnet_train128",
            "--iterations", str(int(seconds * ips)), "--ips", str(ips),
            "--checkpoint-every", "0.5"]


@contextlib.contextmanager
def api_bed(env: Any, tenancy: Any, users: list[str], no_helper_after: float = 3.0,
            ) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """(API test client, controller, name -> token: ``admin`` and each of ``users`` mapped to
    a fresh Unix account) over an emulated node of 2 GPUs in this process."""
    from fastapi.testclient import TestClient

    from miso.api import UserStore, create_app
    from miso.cluster.local import LocalCluster
    from miso.controller import ControllerConfig

    with contextlib.ExitStack() as stack:
        accts = {u: stack.enter_context(env.account("msec")) for u in users}
        d = env.tmpdir() / "state"
        c = LocalCluster(d, config=ControllerConfig(**CFG, tenancy=tenancy), rate_window=0.5,
                         gpus_per_node=2, start=False)
        stack.callback(c.close)
        for agent in c.transport.agents().values():
            agent.no_helper_after = no_helper_after
        ctl = c.start_controller()
        store = UserStore(d / "users.db")
        tokens = {"admin": store.add("admin", admin=True)}
        for u, a in accts.items():
            tokens[u] = store.add(u, unix_user=a.pw_name)
        client = stack.enter_context(TestClient(create_app(ctl, store, snapshot_ttl=0.0)))
        yield client, ctl, tokens


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _submit(client: Any, token: str, cmd: list[str]) -> str:
    r = client.post("/api/v1/jobs", json={"command": cmd, "env": {"PYTHONPATH": str(SRC)},
                                          "cwd": "/tmp"}, headers=_h(token))
    if r.status_code != 201:
        raise RuntimeError(f"submit: {r.status_code} {r.text[:200]}")
    return str(r.json()["id"])


def _wait_states(ctl: Any, jobs: list[str], timeout: float,
                 states: tuple[str, ...] = ("finished", "failed", "cancelled", "over_limit"),
                 ) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(ctl.store.get(j).state in states for j in jobs):
            return True
        time.sleep(0.1)
    return False


# ---- the scheduling attacks -----------------------------------------------------------------

def quota_overrun(env: Any) -> dict[str, Any]:
    from miso.sched.tenancyconfig import TenancyConfig

    with api_bed(env, TenancyConfig(), ["u"]) as (client, ctl, tok):
        r = client.put("/api/v1/quotas/u", json={"max_in_use": 0.5}, headers=_h(tok["admin"]))
        if r.status_code != 200:
            raise RuntimeError(f"quota: {r.text[:200]}")
        seen: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                for row in ctl.status().get("owners", {}).values():
                    if row.get("name") == "u":
                        seen.append(float(row["in_use"]))
                stop.wait(0.02)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            jobs = [_submit(client, tok["u"], _emu(3.0)) for _ in range(3)]
            done = _wait_states(ctl, jobs, 120)
        finally:
            stop.set()
            t.join(5)
        peak = max(seen, default=0.0)
        return {"quota_overruns": int(peak > 0.5 + 1e-9), "in_use_peak": round(peak, 4),
                "lost": sum(ctl.store.get(j).state != "finished" for j in jobs),
                "completed": int(done)}


def noncheckpointing_hold(env: Any, stop_after: float | None = 2.0, wait: float = 60.0
                          ) -> dict[str, Any]:
    from miso.sched.tenancyconfig import TenancyConfig

    ten = TenancyConfig(preempt_uncheckpointable=True, min_run_s=stop_after) \
        if stop_after is not None else TenancyConfig()
    with api_bed(env, ten, ["h", "l"], no_helper_after=0.3) as (client, ctl, tok):
        hogs = [_submit(client, tok["h"], ["/bin/sleep", "600"]) for _ in range(4)]
        deadline = time.time() + 60
        while time.time() < deadline and sum(ctl.store.get(j).state == "running"
                                             for j in hogs) < 2:
            time.sleep(0.1)
        time.sleep(1.0)  # the agent has seen they have no helper: they cannot checkpoint
        t0 = time.time()
        mine = _submit(client, tok["l"], _emu(2.0))
        done = _wait_states(ctl, [mine], wait, ("finished", "failed"))
        rec = ctl.store.get(mine)
        waited = (rec.ended_at - rec.submitted_at) if done and rec.ended_at \
            else time.time() - t0
        requeued = sum(int(ctl.store.get(j).attempts or 0) > 1 for j in hogs)
        held = int(not done or rec.state != "finished")
        if stop_after is None:  # the baseline: the hold is real without the setting
            return {"baseline_held": held}
        return {"held": held, "l_wait_s": round(waited, 1), "hogs_stopped": requeued}


HOSTILE = (5e-324, 1e6, -0.0, "2", True)


def hostile_weight(env: Any) -> dict[str, Any]:
    from miso.sched.tenancyconfig import TenancyConfig

    with api_bed(env, TenancyConfig(), ["eve", "bob"]) as (client, ctl, tok):
        admin = _h(tok["admin"])
        accepted = 0
        for w in HOSTILE:
            r = client.put("/api/v1/quotas/eve", json={"weight": w}, headers=admin)
            accepted += r.status_code != 422
        for who, w in (("eve", 1e-3), ("bob", 1e3)):
            r = client.put(f"/api/v1/quotas/{who}", json={"weight": w}, headers=admin)
            if r.status_code != 200:
                raise RuntimeError(f"quota {who} {w}: {r.text[:200]}")
        jobs = [_submit(client, tok[who], ["/bin/true"]) for who in ("eve", "bob", "eve")]
        done = _wait_states(ctl, jobs, 60, ("finished",))
        h = client.get("/healthz")
        ok = h.status_code == 200 and h.json().get("ok") is True
        died = ctl.loop.died is not None
        shown = len(ctl.status().get("errors", []))
        return {"accepted_hostile": accepted,
                "loop_deaths": int(not ok or died or not done), "errors_shown": shown}


def attacks() -> dict[str, Attack]:
    """Issue 26's attacks by name (see the module docstring)."""
    b = _bounds()
    return {
        "baseline-old-temp-dir": _with_account(b.baseline_old_temp_dir,
                                               {"root_writes": "baseline_root_writes"}),
        "temp-dir-symlink": _with_account(b.temp_dir_symlink),
        "slurm-precreated": _with_account(b.slurm_precreated),
        "fork-to-limit": _with_account(b.ATTACKS["fork-to-limit"]),
        "memory-hog": _with_account(b.ATTACKS["memory-hog"]),
        "disk-fill": _with_account(b.ATTACKS["disk-fill"]),
        "checkpoint-dir-symlink": _with_account(b.checkpoint_dir_symlink),
        "quota-overrun": quota_overrun,
        "baseline-noncheckpointing-hold": lambda env: noncheckpointing_hold(env, None, 20.0),
        "noncheckpointing-hold": noncheckpointing_hold,
        "hostile-weight": hostile_weight,
    }


#: What must be 0 in every trial (``run.py`` fails the run otherwise).
TARGETS = ("root_writes", "unstopped", "leaks", "quota_overruns", "held", "accepted_hostile",
           "loop_deaths")


if __name__ == "__main__":  # pragma: no cover - run through run.py
    print(__doc__.split("\n\n")[0], file=sys.stderr)
    print(f"run: {sys.executable} {Path(__file__).with_name('run.py')} --suite issue26",
          file=sys.stderr)
    sys.exit(2)
