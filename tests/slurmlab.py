"""A throw-away Slurm cluster on this machine (one node, count-only GPUs) for tests and the
deploy benchmark: munged, slurmctld and slurmd in the foreground, each with its own socket,
ports, state and pid files under one temp dir. Needs root and Debian's slurm-wlm + munge."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "srun")


def missing() -> str | None:
    """Why the lab cannot run here, or None."""
    gone = [b for b in BINARIES if shutil.which(b) is None and
            not Path("/usr/sbin", b).exists()]
    if gone:
        return f"Slurm binaries missing: {', '.join(gone)} (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the Slurm lab runs slurmd, which needs root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmLab:
    """``with SlurmLab(gpus=4) as lab: lab.run(["sbatch", ...])``."""

    def __init__(self, gpus: int = 4, kill_wait: int = 30) -> None:
        self.gpus = gpus
        self.kill_wait = kill_wait
        self.dir = Path(tempfile.mkdtemp(prefix="misoslurm-", dir="/tmp"))  # noqa: S108
        self.node = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}

    # ---- set-up -------------------------------------------------------------------------

    def _fake_gpus(self) -> str:
        """Device files for gres/gpu (it ignores GPUs without ``File``): character devices
        with /dev/null's numbers, plain files where mknod is refused."""
        d = self.dir / "dev"
        d.mkdir()
        for i in range(self.gpus):
            p = d / f"gpu{i}"
            try:
                os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            except OSError:
                p.touch()
        return f"{d}/gpu[0-{self.gpus - 1}]"

    def write_config(self) -> None:
        d = self.dir
        for sub in ("state", "spool", "log", "munge"):
            (d / sub).mkdir()
        os.chmod(d / "munge", 0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld, slurmd = _free_port(), _free_port()
        cpus = os.cpu_count() or 1
        (d / "slurm.conf").write_text(f"""\
ClusterName=misolab
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait={self.kill_wait}
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2000 Gres=gpu:{self.gpus} \
State=UNKNOWN
PartitionName=lab Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        (d / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={self._fake_gpus()}\n")

    def start(self) -> SlurmLab:
        self.write_config()
        d = self.dir
        log = open(d / "log" / "daemons.out", "ab")  # noqa: SIM115 - lives as long as they do
        self.procs.append(subprocess.Popen(
            [_bin("munged"), "-F", "-f", f"--socket={d}/munge/sock",
             f"--key-file={d}/munge/munge.key", f"--pid-file={d}/munge/pid",
             f"--log-file={d}/log/munged.log", f"--seed-file={d}/munge/seed"],
            stdout=log, stderr=subprocess.STDOUT))
        self._wait(lambda: (d / "munge" / "sock").exists(), 15, "munged")
        conf = str(d / "slurm.conf")
        self.procs.append(subprocess.Popen([_bin("slurmctld"), "-D", "-i", "-f", conf],
                                           stdout=log, stderr=subprocess.STDOUT, env=self.env))
        self.procs.append(subprocess.Popen([_bin("slurmd"), "-D", "-N", self.node, "-f", conf],
                                           stdout=log, stderr=subprocess.STDOUT, env=self.env))
        log.close()
        self._wait(lambda: self.node_state() == "idle", 60, "the node to come up idle")
        return self

    def _wait(self, pred: object, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if pred():  # type: ignore[operator]
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}:\n"
                                       f"{self.logs()}")
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")

    # ---- use ----------------------------------------------------------------------------

    def run(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, env={**self.env, **kw.pop("env", {})},  # type: ignore[dict-item]
                              capture_output=True, text=True, timeout=60, check=False, **kw)

    def node_state(self) -> str:
        r = self.run(["sinfo", "-h", "-N", "-o", "%T"])
        return r.stdout.strip() if r.returncode == 0 else ""

    def job_state(self, job: str) -> str:
        """The job's state in squeue ("" once it has left the queue)."""
        r = self.run(["squeue", "-h", "-j", job, "-o", "%T"])
        return r.stdout.strip() if r.returncode == 0 else ""

    def logs(self) -> str:
        out = []
        for f in sorted((self.dir / "log").glob("*")):
            lines = f.read_text(errors="replace").splitlines()[-15:]
            out.append(f"== {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        self.run(["scancel", "--full", "--user", str(os.getuid())])
        deadline = time.time() + self.kill_wait + 15
        while time.time() < deadline and self.run(["squeue", "-h"]).stdout.strip():
            time.sleep(0.5)
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SlurmLab:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *_: object) -> None:
        self.stop()


def processes_of_job(job: str) -> list[str]:
    """``"PID command"`` of every process that still carries ``SLURM_JOB_ID=job``."""
    want = f"SLURM_JOB_ID={job}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path("/proc", entry, "environ").read_bytes().split(b"\0")
            if want in env:
                cmd = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ")
                out.append(f"{entry} {cmd.decode(errors='replace')[:160]}")
        except OSError:
            continue
    return out
