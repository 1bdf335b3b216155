"""The service units and the Kubernetes manifest of docs/deploy.md: systemd-analyze accepts
the units (their ``miso`` pointed at this environment's), they hold what an operator relies on,
the RayCluster has KubeRay's required fields and miso's shape; and the head unit's command,
run here as systemd would run it, comes up, says READY=1 and on SIGTERM has every job save and
leaves nothing behind (slow)."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import wait_for

from miso.deploy import node as nd
from miso.deploy import slurm

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
K8S = ROOT / "deploy" / "k8s" / "raycluster.yaml"


def unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    # repeated keys (Environment=) are legal in units: keep the last, read them raw below
    cp.read_string((UNITS / name).read_text().replace("\\\n", " "))
    return cp


def environment(name: str) -> dict[str, str]:
    out = {}
    for line in (UNITS / name).read_text().splitlines():
        if line.startswith("Environment="):
            k, _, v = line[len("Environment="):].partition("=")
            out[k] = v
    return out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze missing (apt-get install systemd)")
def test_units__systemd_analyze_verify_accepts_them(tmp_path: Path) -> None:
    miso_bin = shutil.which("miso") or str(Path(sys.executable).parent / "miso")
    for u in ("miso-head.service", "miso-agent.service"):
        (tmp_path / u).write_text((UNITS / u).read_text().replace("/usr/local/bin/miso",
                                                                   miso_bin))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no",
                        *map(str, sorted(tmp_path.glob("*.service")))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), \
        r.stdout + r.stderr


@pytest.mark.parametrize("name", ["miso-head.service", "miso-agent.service"])
def test_units__state_dir_token_restart_and_an_orderly_stop(name: str) -> None:
    cp = unit(name)
    svc = cp["Service"]
    env = environment(name)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"].startswith("/etc/")
    assert env["MISO_STATE_DIR"] == "/var/lib/miso"
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"
    assert svc["KillMode"] == "mixed"  # SIGTERM to `miso node` only: it stops things in order
    assert svc["Restart"] in ("on-failure", "always")
    assert svc["UMask"] == "0077"
    start = svc["ExecStart"].split()
    assert start[:2] == ["/usr/local/bin/miso", "node"]
    assert "--state-dir" in start and start[start.index("--state-dir") + 1] == "/var/lib/miso"
    grace = float(start[start.index("--grace") + 1])
    stop_s = float(svc["TimeoutStopSec"])
    assert grace + 15 < stop_s  # the jobs' grace and Ray's stop fit before systemd's SIGKILL
    assert cp["Install"]["WantedBy"] == "multi-user.target"
    if name == "miso-agent.service":
        assert svc["ExecStartPre"].split() == ["/usr/local/bin/miso", "doctor"]
        assert "--start-agent" in start and "nvml" in start
    else:
        assert "--head" in start and "--controller" in start
        assert svc["StateDirectory"] == "miso"


def test_units__every_miso_flag_in_them_exists() -> None:
    """The units' `miso node` options are options `miso node` has (a typo would only show
    when systemd starts the unit)."""
    from typer.testing import CliRunner

    from miso.cli import app

    helptext = CliRunner().invoke(app, ["node", "--help"], terminal_width=200).output
    for name in ("miso-head.service", "miso-agent.service"):
        start = unit(name)["Service"]["ExecStart"].split()
        ours = start[2:start.index("--")] if "--" in start else start[2:]
        for flag in (a for a in ours if a.startswith("--")):
            assert flag in helptext, (name, flag)


# ---- Kubernetes -----------------------------------------------------------------------------


def manifest() -> dict[str, Any]:
    docs = list(yaml.safe_load_all(K8S.read_text()))
    [rc] = [d for d in docs if d["kind"] == "RayCluster"]
    return rc


def test_k8s__raycluster_has_kuberays_required_fields() -> None:
    rc = manifest()
    assert rc["apiVersion"] == "ray.io/v1" and rc["metadata"]["name"]
    spec = rc["spec"]
    head = spec["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict)
    assert head["template"]["spec"]["containers"][0]["image"]
    for g in spec["workerGroupSpecs"]:
        assert g["groupName"] and isinstance(g["rayStartParams"], dict)
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        assert g["template"]["spec"]["containers"][0]["image"]
    import ray

    assert spec["rayVersion"] == ray.__version__  # the image's Ray must match miso's


def test_k8s__one_privileged_worker_per_node_with_all_its_gpus_and_a_miso_head() -> None:
    spec = manifest()["spec"]
    [g] = spec["workerGroupSpecs"]
    pod = g["template"]["spec"]
    [c] = pod["containers"]
    assert c["securityContext"]["privileged"] is True
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == c["resources"]["requests"]["nvidia.com/gpu"] and gpus >= 1
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["labelSelector"]["matchLabels"] == g["template"]["metadata"]["labels"]
    assert json.loads(json.loads(g["rayStartParams"]["resources"])) == {"miso_agent": 1}
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "miso cluster up --address 127.0.0.1:6379" in " ".join(
        head["lifecycle"]["postStart"]["exec"]["command"])
    assert head["lifecycle"]["preStop"]["exec"]["command"][:4] == \
        ["python", "-m", "miso.deploy.actions", "drain"]
    for ct in (head, c):
        env = {e["name"]: e["value"] for e in ct["env"]}
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"]
        # a dead worker's children live on: each guard ends its own job (issue 26)
        assert env["RAY_kill_child_processes_on_worker_exit"] == "0"
        mounts = {m["mountPath"] for m in ct["volumeMounts"]}
        assert env["MISO_STATE_DIR"] in mounts
        assert os.path.dirname(env["RAY_AUTH_TOKEN_PATH"]) in mounts


# ---- the head unit's command, run as systemd runs it -----------------------------------------


def miso(sd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "miso.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "MISO_STATE_DIR": str(sd)})


@pytest.mark.slow
@pytest.mark.ray
def test_node__head_with_controller_notifies_ready_and_drains_on_sigterm(
        tmp_path: Path) -> None:
    sd = tmp_path / "state"
    mark = uuid.uuid4().hex
    ports = slurm.choose_ports(int(mark[:8], 16), nd.port_free)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(180)
    temp = f"/tmp/miso-node-{mark[:8]}"  # noqa: S108 - Ray's sockets need a short path
    # the head unit's ExecStart, with this machine's paths (no TLS: loopback)
    p = subprocess.Popen(
        [sys.executable, "-m", "miso.cli", "node", "--head", "--ports-block",
         str(ports.block), "--node-ip", "127.0.0.1", "--controller", "--state-dir", str(sd),
         "--temp-dir", temp, "--grace", "15", "--", "--emulated", "--gpus", "2",
         "--profile-seconds", "0.5"],
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"), "DEPLOY_MARK": mark,
             "RAY_USAGE_STATS_ENABLED": "0"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        assert notify.recv(64) == b"READY=1"
        r = miso(sd, "submit", "--name", "long", "--memory-gb", "4", "--", sys.executable,
                 "-m", "miso.emuworkload", "--workload", "resnet_train128", "--iterations",
                 "100000", "--ips", "40")
        assert r.returncode == 0, r.stderr

        def running() -> dict[str, Any] | None:
            out = miso(sd, "status", "--json")
            js = json.loads(out.stdout)["jobs"] if out.returncode == 0 else []
            return next((j for j in js if j["state"] == "running" and
                         (j.get("iteration") or 0) > 50), None)
        job = wait_for(running, 120)
        p.send_signal(signal.SIGTERM)  # systemctl stop (KillMode=mixed)
        out, _ = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        notify.close()
    assert p.returncode == 0, out
    assert "every job saved and stopped" in out, out
    last = max((sd / "agents").glob(f"*/jobs/{job['id']}/attempt-*"),
               key=lambda d: int(d.name.split("-")[1]))
    assert json.loads((last / "exit.json").read_text())["returncode"] == 75
    assert not Path(temp).exists()

    def none_left() -> bool:
        want = f"DEPLOY_MARK={mark}".encode()
        for e in os.listdir("/proc"):
            try:
                if e.isdigit() and want in Path("/proc", e, "environ").read_bytes().split(b"\0"):
                    return False
            except OSError:
                continue
        return True
    wait_for(none_left, 10)


def test_docs__every_miso_command_in_deploy_md_uses_options_that_exist() -> None:
    """docs/deploy.md's `miso ...` lines: each subcommand exists and has each option used."""
    import re

    from typer.testing import CliRunner

    from miso.cli import app

    text = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [ln.split("#")[0].strip() for b in blocks for ln in b.splitlines()]
    checked = 0
    for ln in lines:
        words = ln.split()
        if not words or words[0] != "miso":
            continue
        words = words[:words.index("--")] if "--" in words else words
        path = [w for w in words[1:] if not w.startswith("-")][:2]
        out = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
        if out.exit_code != 0:  # a one-word command with an argument (miso submit NAME)
            path = path[:1]
            out = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
        assert out.exit_code == 0, (ln, out.output)
        for flag in (w.split("=")[0] for w in words if w.startswith("--")):
            assert flag in out.output, (ln, flag)
        checked += 1
    assert checked >= 3
