"""Fault-injection benchmark of the live cluster (issue 9): N trials of each fault, and per
trial the jobs lost, jobs that ran twice at once (sampled from /proc every 50 ms), progress
lost beyond the last checkpoint and invalid layouts applied.

    python benchmarks/faults/run.py --trials 10 --slow-trials 3 --json faults.json

Faults (all on emulated GPUs, short jobs of the reference workload that checkpoint every
0.5 s, real processes):

* ``controller-kill``: SIGKILL the controller actor while jobs run (Ray restarts it).
* ``agent-kill``: SIGKILL the agent of a node running jobs; a new agent joins later.
* ``agent-stop``: SIGSTOP that agent (a hung node) until the trial's jobs are done.
* ``submit-kill``: SIGKILL the controller while submissions are in flight; the client retries
  with the same request id.
* ``store-damage``: the controller dies, its ``miso.db`` is truncated (odd trials) or deleted
  (even); a restart must refuse with one line; then the backup is restored as the line says.
* ``disk-full``: the state directory is a 16 MiB tmpfs, filled to the last byte for 4 s
  while jobs run (a real ENOSPC, not an injected one).
* ``whole-cluster`` (slow): SIGKILL every process of a ``miso cluster up --emulated`` head
  and every job, then ``cluster up`` again on the same state directory.
* ``concurrent-up`` (slow): two ``miso cluster up --emulated`` on one state directory at once.
* ``head-kill`` (slow, issue 26): one cluster, 6 checkpointing jobs, ``--cycles`` times: SIGKILL
  the head's process group (``--head-kill session``: its whole session; the jobs and their
  guards live on in their own sessions)
  at a random moment - every other cycle right after a decision (a new attempt row) - then
  ``cluster up`` again; the jobs must each run at most once at a time (a /proc sampler), none
  lost, no progress lost.

The in-driver faults share one private Ray (this process is its driver) with a controller and
two agents of two GPUs each (``lease_s`` 3 s, polls time out after 1 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from miso import raycluster as rc
from miso.mig import Placement, geometry, violations

CFG: dict[str, Any] = {"profile_seconds_per_level": 0.3, "profile_warmup_s": 0.15,
                       "checkpoint_timeout": 3.0, "poll_interval": 0.2, "lease_s": 3.0,
                       "poll_timeout": 1.0, "estimator": "true"}
WORKLOADS = ("resnet_train128", "bert_train2", "gnn_train512", "mobilenet_train128")
ROOT = Path(__file__).resolve().parents[2]


def job_cmd(wl: str, seconds: float, ips: float = 20.0) -> list[str]:
    return [sys.executable, "-m", "miso.emuworkload", "--workload", wl, "--iterations",
            str(int(seconds * ips)), "--ips", str(ips), "--checkpoint-every", "0.5"]


# ---- measuring ------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Max number of live processes of each job (guards excluded), sampled from /proc."""

    def __init__(self, mark: str) -> None:
        super().__init__(daemon=True)
        self.needle = f"MISO_BENCH={mark}".encode()
        self.max: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            seen: dict[str, int] = {}
            for e in os.scandir("/proc"):
                if not e.name.isdigit():
                    continue
                try:
                    env = Path(f"/proc/{e.name}/environ").read_bytes().split(b"\0")
                    if self.needle not in env:
                        continue
                    if b"guard.py" in Path(f"/proc/{e.name}/cmdline").read_bytes():
                        continue
                    stat = Path(f"/proc/{e.name}/stat").read_text()
                except OSError:
                    continue
                if stat.rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                jid = next((x.split(b"=", 1)[1].decode() for x in env
                            if x.startswith(b"MISO_JOB_ID=")), "?")
                seen[jid] = seen.get(jid, 0) + 1
            for j, n in seen.items():
                self.max[j] = max(self.max.get(j, 0), n)
            self.stop.wait(0.05)

    def finish(self) -> dict[str, int]:
        self.stop.set()
        self.join(5)
        return self.max


def read_store(sd: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                  list[dict[str, Any]]]:
    con = sqlite3.connect(f"file:{sd / 'miso.db'}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        jobs = [dict(r) for r in con.execute("SELECT * FROM jobs")]
        atts = [dict(r) for r in con.execute("SELECT * FROM attempts ORDER BY job, attempt")]
        lays = [dict(r) for r in con.execute("SELECT * FROM layouts")]
    finally:
        con.close()
    return jobs, atts, lays


def evaluate(sd: Path, mark: str, expected: int, copies: dict[str, int],
             since: float = -1.0) -> dict[str, Any]:
    """The four figures of one trial from the store and the process samples."""
    jobs, atts, lays = read_store(sd)
    mine = [j for j in jobs if mark in (j.get("env") or "")]
    lost = max(0, expected - len(mine)) + sum(j["state"] != "finished" for j in mine)
    twice = sum(n > 1 for n in copies.values())
    progress_lost = 0
    for j in mine:
        saved = None
        for a in [a for a in atts if a["job"] == j["id"]]:
            if a["start_iteration"] is not None and saved is not None:
                progress_lost += max(0, saved - a["start_iteration"])
            if a["checkpoint_iteration"] is not None:
                saved = max(saved or 0, a["checkpoint_iteration"])
    invalid = sum(bool(violations(geometry(r["model"]), [Placement(s, p) for s, p in
                                                           json.loads(r["layout"])]))
                  for r in lays if r["at"] >= since)
    return {"jobs": len(mine), "lost": lost, "twice": twice, "progress_lost": progress_lost,
            "invalid_layouts": invalid,
            "restarts": sum(int(j["restarts"] or 0) for j in mine)}


def wait_until(pred: Any, timeout: float, step: float = 0.2) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if pred():
                return True
        except Exception:  # noqa: BLE001, S110 - e.g. the controller is restarting
            pass
        time.sleep(step)
    return False


# ---- the in-driver cluster ------------------------------------------------------------------


class Bed:
    """A private Ray with a controller actor and agents ``node0``, ``node1`` (2 GPUs each)."""

    def __init__(self, sd: Path) -> None:
        import ray

        self.ray = ray
        self.sd = sd
        sd.mkdir(parents=True, exist_ok=True)
        rc.init_local(key=str(sd))
        self.agents: dict[str, Any] = {}
        for n in ("node0", "node1"):
            self.start_agent(n)
        self.ctl = rc.start_controller(str(sd), CFG)

    def start_agent(self, node: str) -> None:
        cls = self.ray.remote(rc.AgentActor)
        for _ in range(50):
            try:
                h = cls.options(name=rc.AGENT_PREFIX + node, namespace=rc.NAMESPACE,
                                lifetime="detached", num_cpus=0, max_concurrency=16).remote(
                    node, {"kind": "emulated", "gpus": 2}, str(self.sd / "agents" / node),
                    0.5, 0.25)
                self.ray.get(h.ping.remote(), timeout=60)
                self.agents[node] = h
                return
            except Exception:  # noqa: BLE001 - the old actor's name is not free yet
                time.sleep(0.3)
        raise RuntimeError(f"agent {node} did not start")

    def pid(self, h: Any) -> int:
        return int(self.ray.get(h.pid.remote(), timeout=30))

    def call(self, fn: Any, timeout: float = 60.0) -> Any:
        deadline = time.time() + timeout
        while True:
            try:
                return self.ray.get(fn(), timeout=10)
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.3)

    def submit(self, mark: str, wl: str, seconds: float, request: str | None = None) -> str:
        request = request or uuid.uuid4().hex
        res = self.call(lambda: self.ctl.submit.remote(job_cmd(wl, seconds), None, None, None,
                                                       {"MISO_BENCH": mark}, str(ROOT),
                                                       request))
        if not res["ok"]:
            raise RuntimeError(res["error"])
        return str(res["id"])

    def status(self) -> dict[str, Any]:
        return dict(self.call(lambda: self.ctl.status.remote()))

    def all_done(self, ids: list[str]) -> bool:
        st = {j["id"]: j for j in self.status()["jobs"]}
        return all(st[i]["state"] in ("finished", "failed", "cancelled") for i in ids)

    def running_on(self, node: str, ids: list[str]) -> bool:
        st = {j["id"]: j for j in self.status()["jobs"]}
        return any(st[i]["state"] == "running" and (st[i]["gpu"] or "").startswith(node)
                   and (st[i]["checkpoint_iteration"] or 0) > 0 for i in ids)

    def close(self) -> None:
        try:
            rc.stop_actors(stop_jobs=True)
        finally:
            self.ray.shutdown()


def in_driver_trial(bed: Bed, fault: str, k: int, rng: random.Random) -> dict[str, Any]:
    mark = f"{fault}-{k}-{uuid.uuid4().hex[:6]}"
    samp = Sampler(mark)
    samp.start()
    t0 = bed.status()["time"]
    wls = rng.sample(WORKLOADS, 3)
    note = ""
    expected = 3
    if fault == "submit-kill":
        ids: list[str] = []
        pid = bed.pid(bed.ctl)
        killer = threading.Timer(rng.uniform(0.0, 0.4), os.kill, (pid, signal.SIGKILL))
        killer.start()
        for wl in wls:  # each retried with its request id until the controller answers
            ids.append(bed.submit(mark, wl, 4.0, request=uuid.uuid4().hex))
        killer.join()
    else:
        ids = [bed.submit(mark, wl, 5.0) for wl in wls]
        node = rng.choice(["node0", "node1"])
        if not wait_until(lambda: bed.running_on(node, ids), 60):
            node = "node1" if node == "node0" else "node0"
            wait_until(lambda: bed.running_on(node, ids), 30)
        if fault == "controller-kill":
            os.kill(bed.pid(bed.ctl), signal.SIGKILL)
        elif fault == "agent-kill":
            os.kill(bed.pid(bed.agents[node]), signal.SIGKILL)
            bed.start_agent(node)
        elif fault == "agent-stop":
            pid = bed.pid(bed.agents[node])
            os.kill(pid, signal.SIGSTOP)
            try:
                wait_until(lambda: bed.all_done(ids), 120)
            finally:
                os.kill(pid, signal.SIGCONT)
        elif fault == "store-damage":
            note = store_damage(bed, k)
        elif fault == "disk-full":
            note = fill_disk(bed.sd, 4.0)
    done = wait_until(lambda: bed.all_done(ids), 150)
    out = evaluate(bed.sd, mark, expected, samp.finish(), since=t0)
    out.update(fault=fault, trial=k, completed=done, note=note)
    return out


def store_damage(bed: Bed, k: int) -> str:
    import ray

    ray.kill(bed.ctl, no_restart=True)  # the controller process dies (no restart)
    time.sleep(0.5)
    db = bed.sd / "miso.db"
    for side in bed.sd.glob("miso.db-*"):
        side.unlink()
    if k % 2:
        db.write_bytes(b"")
    else:
        db.unlink()
    try:
        rc.start_controller(str(bed.sd), CFG)
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    if not refused or "\n" in refused:
        raise AssertionError(f"a damaged store was not refused with one line: {refused!r}")
    os.replace(bed.sd / "miso.db.bak", db)  # what the error line says to do
    bed.ctl = rc.start_controller(str(bed.sd), CFG)
    return refused.split(";")[0]


def fill_disk(sd: Path, seconds: float) -> str:
    filler = sd / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 512, 1):  # down to the last byte
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    free = os.statvfs(sd).f_bavail * os.statvfs(sd).f_frsize
    time.sleep(seconds)
    filler.unlink()
    return f"full for {seconds:g}s ({free} bytes free)"


# ---- faults of whole clusters (slow: a Ray start per cluster) -------------------------------


def cli(sd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    at = 2 if args[0] == "cluster" else 1  # options before a job's `--`
    return subprocess.run([sys.executable, "-m", "miso.cli", *args[:at], "--state-dir", str(sd),
                           *args[at:]], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def up_args(sd: Path) -> list[str]:
    return ["cluster", "up", "--emulated", "--gpus", "2", "--profile-seconds", "0.3",
            "--checkpoint-timeout", "3", "--estimator", "true"]


def session_pids(sid: int) -> list[int]:
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                if int(Path(f"/proc/{e.name}/stat").read_text().rsplit(")", 1)[1].split()[3]) \
                        == sid:
                    out.append(int(e.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def marked_pids(mark: str) -> list[int]:
    from miso.backend.emulated import pids_with_env

    return pids_with_env("MISO_BENCH", mark)


def cli_submit(sd: Path, mark: str, wl: str, seconds: float) -> str:
    r = cli(sd, "submit", "--env", f"MISO_BENCH={mark}", "--", *job_cmd(wl, seconds))
    if r.returncode:
        raise RuntimeError(r.stderr.strip())
    return r.stdout.strip()


def cli_states(sd: Path) -> dict[str, str]:
    r = cli(sd, "status", "--json")
    return {j["id"]: j["state"] for j in json.loads(r.stdout)["jobs"]} if not r.returncode \
        else {}


def whole_cluster_trial(base: Path, k: int, rng: random.Random) -> dict[str, Any]:
    sd = base / f"whole-{k}"
    mark = f"whole-{k}-{uuid.uuid4().hex[:6]}"
    r = cli(sd, *up_args(sd))
    if r.returncode:
        raise RuntimeError(r.stderr.strip())
    samp = Sampler(mark)
    samp.start()
    try:
        ids = [cli_submit(sd, mark, wl, 6.0) for wl in rng.sample(WORKLOADS, 3)]
        wait_until(lambda: "running" in cli_states(sd).values(), 60, 1.0)
        time.sleep(rng.uniform(0.5, 2.0))
        head = int(json.loads((sd / "cluster.json").read_text())["pid"])
        for p in session_pids(head) + marked_pids(mark):  # the machine dies
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(1.0)
        r = cli(sd, *up_args(sd))
        if r.returncode:
            raise RuntimeError(f"restart: {r.stderr.strip()}")
        done = wait_until(lambda: all(cli_states(sd).get(i) == "finished" for i in ids), 180,
                          1.0)
    finally:
        cli(sd, "cluster", "down")
    out = evaluate(sd, mark, 3, samp.finish())
    out.update(fault="whole-cluster", trial=k, completed=done, note="")
    return out


def attempt_rows(sd: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{sd / 'miso.db'}?mode=ro", uri=True, timeout=1.0)
        try:
            return int(con.execute("SELECT COUNT(*) FROM attempts").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return -1


def up_again(sd: Path, timeout: float = 120.0) -> None:
    """``cluster up`` until it starts (right after a SIGKILL the state lock may still be
    held for a moment)."""
    deadline = time.time() + timeout
    while True:
        r = cli(sd, *up_args(sd))
        if not r.returncode:
            return
        if time.time() > deadline:
            raise RuntimeError(f"restart: {r.stderr.strip()}")
        time.sleep(1.0)


def head_kill_trial(base: Path, k: int, rng: random.Random, cycles: int = 20,
                    jobs: int = 6, seconds: float = 20.0, kill: str = "pgroup",
                    ) -> dict[str, Any]:
    sd = base / f"head-{k}"
    mark = f"head-{k}-{uuid.uuid4().hex[:6]}"
    r = cli(sd, *up_args(sd))
    if r.returncode:
        raise RuntimeError(r.stderr.strip())
    samp = Sampler(mark)
    samp.start()
    done = False
    kinds = []
    busy = 0  # kills with a job running (once all have finished a kill tests nothing)
    try:
        ids = [cli_submit(sd, mark, WORKLOADS[i % len(WORKLOADS)], seconds)
               for i in range(jobs)]
        for c in range(cycles):
            busy += wait_until(lambda: "running" in cli_states(sd).values(), 60, 0.5)
            if c % 2 == 0:  # right after a decision: a new attempt row appears
                n0 = attempt_rows(sd)
                wait_until(lambda n0=n0: attempt_rows(sd) > n0, 20, 0.02)
                kinds.append("after-decision")
            else:
                time.sleep(rng.uniform(0.2, 3.0))
                kinds.append("random")
            head = int(json.loads((sd / "cluster.json").read_text())["pid"])
            if kill == "pgroup":  # the head's process group, as the issue did: Ray's
                with contextlib.suppress(ProcessLookupError):  # processes outlive it a while
                    os.killpg(os.getpgid(head), signal.SIGKILL)
            else:
                for p in session_pids(head):  # the head's whole session dies at once
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
            up_again(sd)
        done = wait_until(lambda: all(cli_states(sd).get(i) == "finished" for i in ids),
                          600, 1.0)
    finally:
        cli(sd, "cluster", "down")
        for p in marked_pids(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    out = evaluate(sd, mark, jobs, samp.finish())
    out.update(fault="head-kill", trial=k, completed=done, cycles=cycles, kill=kill,
               kills_after_decision=kinds.count("after-decision"), kills_while_running=busy,
               job_seconds=seconds, note="")
    return out


def concurrent_up_trial(base: Path, k: int, rng: random.Random) -> dict[str, Any]:
    sd = base / f"twice-{k}"
    mark = f"twice-{k}-{uuid.uuid4().hex[:6]}"
    cmd = [sys.executable, "-m", "miso.cli", *up_args(sd)[:2], "--state-dir", str(sd),
           *up_args(sd)[2:]]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT) for _ in range(2)]
    res = [p.communicate(timeout=300) for p in procs]
    ok = [p.returncode == 0 for p in procs]
    refusal = next((e.strip() for (_, e), good in zip(res, ok, strict=True) if not good), "")
    heads = sum(1 for e in os.scandir("/proc") if e.name.isdigit() and
                _is_head_of(int(e.name), sd))
    samp = Sampler(mark)
    samp.start()
    try:
        ids = [cli_submit(sd, mark, wl, 3.0) for wl in rng.sample(WORKLOADS, 2)] \
            if any(ok) else []
        done = wait_until(lambda: all(cli_states(sd).get(i) == "finished" for i in ids), 120,
                          1.0)
    finally:
        cli(sd, "cluster", "down")
    out = evaluate(sd, mark, len(ids), samp.finish()) if ids else \
        {"jobs": 0, "lost": 0, "twice": 0, "progress_lost": 0, "invalid_layouts": 0,
         "restarts": 0}
    out.update(fault="concurrent-up", trial=k, completed=done, heads=heads,
               ups_ok=sum(ok), note=refusal[:160])
    if heads != 1 or sum(ok) != 1:
        out["twice"] += 1  # two controllers on one store count as running every job twice
    return out


def _is_head_of(pid: int, sd: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"miso.raycluster" in argv and b"head" in argv and os.fsencode(str(sd)) in argv


# ---- main -----------------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(r["fault"], {"trials": 0, "jobs": 0, "lost": 0, "twice": 0,
                                        "progress_lost": 0, "invalid_layouts": 0,
                                        "restarts": 0})
        s["trials"] += 1
        for key in ("jobs", "lost", "twice", "progress_lost", "invalid_layouts", "restarts"):
            s[key] += int(r.get(key, 0))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10, help="trials of each in-driver fault")
    ap.add_argument("--slow-trials", type=int, default=3,
                    help="trials of whole-cluster and concurrent-up (a Ray start each)")
    ap.add_argument("--faults", default="controller-kill,agent-kill,agent-stop,submit-kill,"
                    "store-damage,disk-full,whole-cluster,concurrent-up")
    ap.add_argument("--cycles", type=int, default=20, help="head kills per head-kill trial")
    ap.add_argument("--job-seconds", type=float, default=20.0,
                    help="head-kill: each job's length (s); about 8 per cycle keeps jobs "
                    "running through every kill")
    ap.add_argument("--head-kill", choices=("pgroup", "session"), default="pgroup",
                    help="head-kill: SIGKILL the head's process group (Ray's processes outlive "
                    "it a while) or its whole session")
    ap.add_argument("--json", default=None, help="write every trial and the summary here")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    faults = [f for f in a.faults.split(",") if f]
    rng = random.Random(a.seed)
    base = Path(tempfile.mkdtemp(prefix="miso-faults-"))
    rows: list[dict[str, Any]] = []
    t_start = time.time()

    def record(r: dict[str, Any]) -> None:
        rows.append(r)
        print(json.dumps(r), flush=True)

    driver = [f for f in faults if f not in ("whole-cluster", "concurrent-up", "head-kill")]
    plain = [f for f in driver if f != "disk-full"]
    if plain:
        bed = Bed(base / "bed")
        try:
            for f in plain:
                for k in range(a.trials):
                    record(in_driver_trial(bed, f, k, rng))
        finally:
            bed.close()
    if "disk-full" in driver:
        mnt = base / "tmpfs"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                       check=True)
        try:
            bed = Bed(mnt / "state")
            try:
                for k in range(a.trials):
                    record(in_driver_trial(bed, "disk-full", k, rng))
            finally:
                bed.close()
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
    for f in ("whole-cluster", "concurrent-up"):
        if f in faults:
            for k in range(a.slow_trials):
                trial = whole_cluster_trial if f == "whole-cluster" else concurrent_up_trial
                record(trial(base, k, rng))
    if "head-kill" in faults:
        for k in range(a.slow_trials):
            record(head_kill_trial(base, k, rng, a.cycles, seconds=a.job_seconds,
                                   kill=a.head_kill))
    summary = summarize(rows)
    print(json.dumps({"summary": summary, "wall_s": round(time.time() - t_start)}), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"trials": rows, "summary": summary}, indent=1))
    bad = sum(s["lost"] + s["twice"] + s["progress_lost"] + s["invalid_layouts"]
              for s in summary.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
