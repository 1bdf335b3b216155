"""Attacks on the control plane (issue 15, items 3, 6, 7), each run ``trials`` times.

    python benchmarks/security/control_plane.py --trials 10 --json cp.json [--only NAME,...]

:func:`attacks` maps a name to ``function(trials) -> dict`` of counts (``trials``, and
``escalations`` / ``lost`` / ``twice`` / ``affected`` / ``outliving`` / ``leaks`` ... that must
all be 0); ``benchmarks/security/run.py`` runs them with the job-side attacks, calling each
with its per-trial ``Env`` instead of ``trials`` (one trial per call).

* ``agent-sigkill``: a real ``miso cluster up --emulated`` (2 GPUs); per trial 4 jobs of 8 s
  (checkpoint every 0.5 s) are submitted through the API, and once they run the agent actor's
  process is SIGKILLed - no harness help: Ray brings the agent back, the controller fences the
  node and moves the jobs. Counts jobs lost, jobs that ran twice (two live copies at once,
  sampled from /proc every 50 ms, or an attempt started after one that finished), trials whose
  ``miso status`` showed the node lost, and the seconds from the kill until a job process runs
  again under the agent that came back (``recover_s``; target <= 60 s).
* ``user-recreate``: bob submits a job, is removed and re-created under the same name; the new
  bob tries to read, list, cancel and see the logs of the old bob's job (escalations).
* ``users-db-loss``: ``users.db`` of a state directory with jobs is deleted (odd trials) or
  damaged (even); the API must refuse to start with one line (``accepted`` counts starts).
* ``request-id-reuse``: the same ``request_id`` with another payload (409 expected).
* ``unix-user``: an admin asks for ``--unix-user 0``, ``root`` and an account that does not
  exist (each accepted one is an escalation).
* ``token-fallback``: ``miso status --token ''`` beside an operator token (a run that answers
  is an escalation).
* ``metrics-anonymous``: ``GET /metrics`` without a token on a loopback API.
* ``cross-user-views``: alice reads status, jobs, events, the web page's cluster view and
  ``/metrics``; any id, name or user name of bob's jobs in them is a leak.
* ``gpus-bound``: ``miso cluster up --emulated --gpus 100000`` (refused with one line?).
* ``up-interrupted``: ``miso cluster up`` is killed while its head starts, then ``miso cluster
  down``: ``heads_left`` counts heads still running.

The API attacks run against a live controller (one emulated node, in process) and the real API
app; the command-line ones run the real ``miso`` in a new process.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MISO_CONFIG": "/nonexistent/miso.json"}


def _faults() -> Any:
    """The fault benchmark's /proc sampler and store reader (benchmarks/faults/run.py)."""
    spec = importlib.util.spec_from_file_location("miso_bench_faults",
                                                  ROOT / "benchmarks" / "faults" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def miso(*args: str, timeout: float = 300.0, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    """The real ``miso`` command line (a new process)."""
    return subprocess.run([sys.executable, "-m", "miso.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=env or ENV,
                          check=False)


def job_cmd(seconds: float, ips: float = 20.0) -> list[str]:
    return [sys.executable, "-m", "miso.emuworkload", "--workload", "bert_train2",
            "--iterations", str(int(seconds * ips)), "--ips", str(ips),
            "--checkpoint-every", "0.5"]


# ---- agent SIGKILL under `miso cluster up` --------------------------------------------------


def _agent_of(pid: int) -> int:
    """The agent PID whose guard started job process ``pid`` (its parent's ``--agent-pid``)."""
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
        return int(argv[argv.index(b"--agent-pid") + 1])
    except (OSError, ValueError, IndexError):
        return 0


def _job_pids(mark: str) -> set[int]:
    from miso.backend.emulated import pids_with_env

    out = set()
    for pid in pids_with_env("MISO_BENCH", mark):
        with contextlib.suppress(OSError):
            if b"guard.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
    return out


def _ran_after_finish(sd: Path, ids: list[str]) -> int:
    """Jobs with an attempt started after one of their attempts had finished."""
    con = sqlite3.connect(f"file:{sd / 'miso.db'}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT job, attempt, status, started_at, ended_at FROM attempts "
                           "ORDER BY job, attempt").fetchall()
    finally:
        con.close()
    bad = set()
    for job, _, status, _, ended in rows:
        if job in ids and status == "finished" and \
                any(j == job and s > (ended or 0) for j, _, _, s, _ in rows):
            bad.add(job)
    return len(bad)


def agent_sigkill(trials: int, *, jobs: int = 4, seconds: float = 8.0) -> dict[str, Any]:
    """See the module docstring."""
    from miso import raycluster as rc
    from miso.api.client import Client
    from miso.api.credentials import from_state_dir

    faults = _faults()
    sd = Path(tempfile.mkdtemp(prefix="miso-sec-agent-kill-")) / "state"
    r = miso("cluster", "up", "--emulated", "--gpus", "2", "--state-dir", str(sd),
             "--profile-seconds", "0.3", "--checkpoint-timeout", "3")
    if r.returncode != 0:
        raise RuntimeError(f"cluster up failed: {r.stderr.strip()}")
    out: dict[str, Any] = {"trials": trials, "jobs": 0, "lost": 0, "twice": 0,
                           "lost_shown": 0, "recover_s": [], "escalations": 0}
    try:
        cred = from_state_dir(sd)
        c = Client(str(cred.url), str(cred.token))
        for k in range(trials):
            mark = f"cp-{uuid.uuid4().hex[:8]}"
            samp = faults.Sampler(mark)
            samp.start()
            ids = [c.submit(job_cmd(seconds), name=f"t{k}-{i}", env={"MISO_BENCH": mark})
                   for i in range(jobs)]
            faults.wait_until(lambda m=mark: len(_job_pids(m)) >= 2, 120, 0.1)
            time.sleep(1.0)  # a checkpoint or two
            pids = rc.local_agent_pids(sd)
            if len(pids) != 1:
                raise RuntimeError(f"expected one agent process, found {pids}")
            t_kill = time.time()
            os.kill(pids[0], signal.SIGKILL)
            shown, back = False, None
            deadline = t_kill + 300
            while time.time() < deadline:
                if back is None and any(_agent_of(p) not in (0, pids[0])
                                        for p in _job_pids(mark)):
                    back = time.time() - t_kill  # a job runs under the agent that came back
                with contextlib.suppress(Exception):
                    st = c.status()
                    shown = shown or bool(st.get("lost_nodes"))
                    if all(j["state"] in ("finished", "failed", "cancelled")
                           for j in st["jobs"] if j["id"] in ids):
                        break
                time.sleep(0.25)
            copies = samp.finish()
            st = c.status(limit=100_000)
            done = {j["id"] for j in st["jobs"] if j["state"] == "finished"}
            out["jobs"] += len(ids)
            out["lost"] += sum(j not in done for j in ids)
            out["twice"] += sum(n > 1 for n in copies.values()) + _ran_after_finish(sd, ids)
            out["lost_shown"] += int(shown)
            out["recover_s"].append(round(back, 1) if back is not None else None)
            print(f"agent-sigkill trial {k}: lost {sum(j not in done for j in ids)}, "
                  f"status showed it lost {shown}, jobs moving again after {back}", flush=True)
    finally:
        miso("cluster", "down", "--state-dir", str(sd))
    rec = [x for x in out["recover_s"] if x is not None]
    out["max_recover_s"] = max(rec) if rec else None
    out["within_60s"] = sum(x <= 60 for x in rec)
    out["over_60s"] = trials - out["within_60s"]
    return out


# ---- the API attacks: a live controller (one emulated node, no Ray) and its API ---------------


class Bed:
    """A controller over one in-process agent, its observer, the API app with the observe
    routes as the head mounts them, served on loopback; users admin, alice and bob."""

    def __init__(self) -> None:
        from fastapi.testclient import TestClient

        from miso.agent import Agent
        from miso.api import UserStore, create_app
        from miso.api.server import ApiServer, Listen
        from miso.backend import EmulatedBackend
        from miso.controller import Controller, ControllerConfig
        from miso.controller.storefile import open_store
        from miso.observe import attach
        from miso.observe.routes import api_routers
        from miso.transport.inprocess import LocalTransport

        self.dir = Path(tempfile.mkdtemp(prefix="miso-sec-api-")) / "state"
        self.transport = LocalTransport()
        self.transport.add(Agent("node0", EmulatedBackend(1, node="node0"),
                                 self.dir / "agents" / "node0"))
        self.ctl = Controller(open_store(self.dir), self.transport,
                              ControllerConfig(poll_interval=0.1, profile_seconds_per_level=0.3),
                              checkpoint_root=self.dir / "checkpoints")
        obs = attach(self.ctl, self.dir)
        self.ctl.start()
        self.users = UserStore(self.dir / "users.db")
        self.tokens = {"admin": self.users.add("admin", admin=True, unix_user="nobody"),
                       "alice": self.users.add("alice", unix_user="nobody"),
                       "bob": self.users.add("bob", unix_user="nobody")}
        self.app = create_app(self.ctl, self.users, extra_routers=api_routers(
            self.ctl, obs, "127.0.0.1"), snapshot_ttl=0.0)
        self.server = ApiServer(self.app, Listen("127.0.0.1", 0))
        self.url = self.server.start()
        self.http = TestClient(self.app)

    def h(self, who_or_token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens.get(who_or_token, who_or_token)}"}

    def submit(self, who: str, name: str, **body: Any) -> Any:
        return self.http.post("/api/v1/jobs", json={"command": ["sleep", "60"], "name": name,
                                                    **body}, headers=self.h(who))

    def views(self, who: str) -> str:
        """Every view ``who`` has: status, jobs, events, the page's cluster view, /metrics,
        the page."""
        return "\n".join(self.http.get(p, headers=self.h(who)).text for p in (
            "/api/v1/status", "/api/v1/jobs", "/api/v1/events", "/api/v1/cluster", "/metrics",
            "/"))

    def close(self) -> None:
        self.server.stop()
        self.ctl.stop(stop_jobs=True)  # (the store stays open: a GPU worker may still write)
        for a in self.transport.agents().values():
            a.shutdown()


def _with_bed(fn: Callable[[Bed, int], dict[str, int]]) -> Callable[..., dict[str, Any]]:
    def run(trials: int, first: int = 0) -> dict[str, Any]:
        bed = Bed()
        try:
            out: dict[str, Any] = {"trials": trials}
            for k in range(first, first + trials):
                for key, n in fn(bed, k).items():
                    out[key] = out.get(key, 0) + n
            return out
        finally:
            bed.close()

    run.__doc__ = fn.__doc__
    return run


def _user_recreate(bed: Bed, k: int) -> dict[str, int]:
    """The old bob's job, tried by a new bob of the same name (5 ways)."""
    jid = bed.submit("bob", f"old-{k}").json()["id"]
    bed.http.delete("/api/v1/users/bob", headers=bed.h("admin"))
    new = bed.http.post("/api/v1/users", json={"name": "bob", "unix_user": "nobody"},
                        headers=bed.h("admin")).json()["token"]
    bed.tokens["bob"] = new
    tries = [bed.http.get(f"/api/v1/jobs/{jid}", headers=bed.h(new)).status_code == 200,
             bed.http.get(f"/api/v1/jobs/old-{k}", headers=bed.h(new)).status_code == 200,
             bed.http.get(f"/api/v1/jobs/{jid}/logs", headers=bed.h(new)).status_code == 200,
             bed.http.post(f"/api/v1/jobs/{jid}/cancel", headers=bed.h(new)).status_code == 200,
             jid in bed.views(new)]
    bed.http.post(f"/api/v1/jobs/{jid}/cancel", headers=bed.h("admin"))
    return {"attempts": len(tries), "escalations": sum(tries)}


def _request_id_reuse(bed: Bed, k: int) -> dict[str, int]:
    """The same request id with another name, command and environment."""
    rid = f"req-{uuid.uuid4().hex}"
    first = bed.submit("alice", f"r{k}", request_id=rid).json()["id"]
    answers = [bed.submit("alice", f"r{k}", request_id=rid),
               bed.submit("alice", f"other{k}", request_id=rid),
               bed.submit("alice", f"r{k}", request_id=rid, command=["sleep", "61"]),
               bed.submit("alice", f"r{k}", request_id=rid, env={"A": "1"})]
    bed.http.post(f"/api/v1/jobs/{first}/cancel", headers=bed.h("alice"))
    ok_retry = answers[0].status_code == 201 and answers[0].json()["id"] == first
    refused = [a.status_code == 409 and "\n" not in a.json()["error"] for a in answers[1:]]
    return {"attempts": len(refused), "accepted": len(refused) - sum(refused),
            "affected": len(refused) - sum(refused) + int(not ok_retry),
            "retry_broken": int(not ok_retry)}


def _unix_user(bed: Bed, k: int) -> dict[str, int]:
    """An admin asks for uid 0, root and an account that does not exist."""
    got = [bed.http.post("/api/v1/users", json={"name": f"m{k}x{i}", "unix_user": u},
                         headers=bed.h("admin")).status_code
           for i, u in enumerate(("0", "root", f"nosuch{k}"))]
    return {"attempts": len(got), "escalations": sum(c == 201 for c in got)}


def _metrics_anonymous(bed: Bed, k: int) -> dict[str, int]:
    """``GET /metrics`` without a token on the loopback listener."""
    import httpx

    r = httpx.get(bed.url + "/metrics", timeout=10)
    return {"attempts": 1, "leaks": int(r.status_code == 200),
            "escalations": int(r.status_code == 200)}


def _cross_user_views(bed: Bed, k: int) -> dict[str, int]:
    """alice's views after bob submits a job with a telling name."""
    jid = bed.submit("bob", f"bobsecret{k}").json()["id"]
    time.sleep(0.3)
    seen = bed.views("alice")
    bed.http.post(f"/api/v1/jobs/{jid}/cancel", headers=bed.h("bob"))
    leak = int(any(x in seen for x in (jid, f"bobsecret{k}", "bob")))
    return {"attempts": 1, "leaks": leak, "escalations": leak}


def _token_fallback(bed: Bed, k: int) -> dict[str, int]:
    """``miso status --token ''`` where the state dir holds the admin's (operator) token."""
    sd = bed.dir.parent / f"cli-{k}"
    sd.mkdir(exist_ok=True)
    (sd / "api.json").write_text(json.dumps({"url": bed.url}))
    (sd / "operator.token").write_text(bed.tokens["admin"] + "\n")
    r = miso("status", "--state-dir", str(sd), "--token", "", "--json", timeout=60)
    return {"attempts": 1, "escalations": int(r.returncode == 0),
            "multi_line_errors": int(len(r.stderr.strip().splitlines()) > 1)}


# ---- state directory and cluster up/down ---------------------------------------------------


def users_db_loss(trials: int, first: int = 0) -> dict[str, Any]:
    """``users.db`` missing (odd trials), empty or garbage beside a job store with jobs."""
    from miso.api.head import users_of
    from miso.controller.storefile import open_store

    out = {"trials": trials, "accepted": 0, "multi_line_errors": 0, "recreated": 0}
    for k in range(first, first + trials):
        sd = Path(tempfile.mkdtemp(prefix="miso-sec-users-")) / "state"
        users = users_of(sd)
        users.add("alice", admin=True, unix_user="nobody")
        uid = users.get("alice").id
        users.close()
        store = open_store(sd)
        store.submit(command=["true"], name="x", memory_gb=1.0, owner=uid, owner_name="alice")
        store.close()
        for side in sd.glob("users.db*"):
            side.unlink()
        if k % 3 == 1:
            (sd / "users.db").write_bytes(b"")
        elif k % 3 == 2:
            (sd / "users.db").write_bytes(b"garbage" * 512)
        r = miso("cluster", "up", "--emulated", "--gpus", "1", "--state-dir", str(sd))
        if r.returncode == 0:
            out["accepted"] += 1
            miso("cluster", "down", "--state-dir", str(sd))
        out["multi_line_errors"] += int(len(r.stderr.strip().splitlines()) > 1)
        out["recreated"] += int(k % 3 == 0 and (sd / "users.db").exists())
    out["escalations"] = out["accepted"] + out["recreated"]
    return out


def gpus_bound(trials: int) -> dict[str, Any]:
    """``cluster up --emulated --gpus 100000``: refused at once with one line?"""
    out = {"trials": trials, "accepted": 0, "multi_line_errors": 0, "max_s": 0.0}
    for _ in range(trials):
        sd = Path(tempfile.mkdtemp(prefix="miso-sec-gpus-")) / "state"
        t0 = time.time()
        r = miso("cluster", "up", "--emulated", "--gpus", "100000", "--state-dir", str(sd),
                 timeout=600)
        out["max_s"] = max(out["max_s"], round(time.time() - t0, 2))
        if r.returncode == 0:
            out["accepted"] += 1
            miso("cluster", "down", "--state-dir", str(sd))
        out["multi_line_errors"] += int(len(r.stderr.strip().splitlines()) > 1)
    out["affected"] = out["accepted"]
    return out


def up_interrupted(trials: int) -> dict[str, Any]:
    """``cluster up`` killed while its head starts; then ``cluster down``: is the head gone?"""
    from miso import raycluster as rc

    out = {"trials": trials, "heads_left": 0, "down_failed": 0}
    for _ in range(trials):
        sd = str(Path(tempfile.mkdtemp(prefix="miso-sec-up-")) / "state")
        up = subprocess.Popen([sys.executable, "-m", "miso.cli",
                               "cluster", "up", "--emulated", "--gpus", "1", "--state-dir", sd],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        head = None
        deadline = time.time() + 60
        while head is None and time.time() < deadline:
            info = rc.read_cluster_file(sd)
            head = int(info["pid"]) if info and info.get("pid") else None
            time.sleep(0.1)
        up.kill()
        up.wait()
        r = miso("cluster", "down", "--state-dir", sd)
        out["down_failed"] += int(r.returncode != 0)
        if head is not None and rc.running(head):  # (a zombie waiting for init is gone)
            out["heads_left"] += 1
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head, signal.SIGKILL)
    out["outliving"] = out["heads_left"]
    return out


def _either(fn: Callable[..., dict[str, Any]], numbered: bool = False
            ) -> Callable[[Any], dict[str, Any]]:
    """``fn(trials)`` callable as ``f(trials)`` (an int: all trials, the figures summed) or as
    ``f(env)`` (``benchmarks/security/run.py``'s per-trial ``Env``: one trial numbered
    ``env.trial``, numeric figures only, run.py sums them)."""

    def run(arg: Any) -> dict[str, Any]:
        if isinstance(arg, int):
            return fn(arg)
        k = int(getattr(arg, "trial", 0))
        out = fn(1, first=k) if numbered else fn(1)
        return {key: v for key, v in out.items() if key != "trials" and
                isinstance(v, int | float) and not isinstance(v, bool)}

    run.__doc__ = fn.__doc__
    return run


def attacks() -> dict[str, Callable[[Any], dict[str, Any]]]:
    """Name -> ``function(trials)`` returning counts (see the module docstring); each also
    takes run.py's per-trial ``Env`` instead of ``trials``."""
    return {"agent-sigkill": _either(agent_sigkill),
            "user-recreate": _either(_with_bed(_user_recreate), True),
            "users-db-loss": _either(users_db_loss, True),
            "request-id-reuse": _either(_with_bed(_request_id_reuse), True),
            "unix-user": _either(_with_bed(_unix_user), True),
            "token-fallback": _either(_with_bed(_token_fallback), True),
            "metrics-anonymous": _either(_with_bed(_metrics_anonymous), True),
            "cross-user-views": _either(_with_bed(_cross_user_views), True),
            "gpus-bound": _either(gpus_bound),
            "up-interrupted": _either(up_interrupted)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated attack names")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    table = attacks()
    names = [n for n in a.only.split(",") if n] or list(table)
    results = {}
    for n in names:
        t0 = time.time()
        results[n] = {**table[n](a.trials), "wall_s": round(time.time() - t0, 1)}
        print(json.dumps({n: results[n]}), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
