"""A real Prometheus server (Debian's ``prometheus`` package) scrapes ``/metrics`` of a local
emulated cluster, and a miso metric is read back through Prometheus' HTTP API. Everything on
127.0.0.1. Slow (Prometheus start-up, scrape intervals):

    apt-get install -y prometheus
    python -m pytest -m slow tests/test_prometheus.py
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import emu

from miso.api.server import ApiServer, Listen
from miso.cluster.local import LocalCluster
from miso.controller import Controller, ControllerConfig, JobStore
from miso.observe import attach
from miso.observe.routes import make_app

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="needs Debian's prometheus (apt-get install prometheus)")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def query(base: str, q: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": q}, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_prometheus_scrapes_the_cluster_and_answers_a_miso_query(tmp_path: Path) -> None:
    cfg = ControllerConfig(policy="miso", estimator="true", poll_interval=0.1,
                           checkpoint_timeout=5.0)
    cluster = LocalCluster(tmp_path / "c", gpus_per_node=2, config=cfg, rate_window=0.5,
                           start=False)
    server = prom = None
    try:
        ctl = Controller(JobStore(tmp_path / "c" / "miso.db"), cluster.transport, cfg,
                         checkpoint_root=tmp_path / "c" / "checkpoints")
        obs = attach(ctl, tmp_path / "c")
        cluster.controller = ctl.start()
        server = ApiServer(make_app(ctl, obs), Listen("127.0.0.1", 0))
        url = server.start()
        target = url.removeprefix("http://")
        port = free_port()
        conf = tmp_path / "prometheus.yml"
        conf.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: miso\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prom.log").open("wb"))
        base = f"http://127.0.0.1:{port}"
        for wl in ("resnet_train128", "bert_train2", "gnn_train512"):
            ctl.submit(emu(wl, 120))
        deadline = time.time() + 120
        got: list[dict[str, Any]] = []
        while time.time() < deadline:
            assert prom.poll() is None, (tmp_path / "prom.log").read_text()[-2000:]
            try:
                got = query(base, 'miso_decisions_total{job="miso",kind="PlaceJob"}')
            except httpx.HTTPError:
                got = []
            if got and float(got[0]["value"][1]) == 3:
                break
            time.sleep(0.5)
        assert got and float(got[0]["value"][1]) == 3, got
        up = query(base, 'up{job="miso"}')
        assert float(up[0]["value"][1]) == 1
        # a gauge read at scrape time: the three jobs are resident on the two GPUs
        deadline = time.time() + 60
        while time.time() < deadline:
            res = query(base, 'sum(miso_gpu_jobs{job="miso"})')
            if res and float(res[0]["value"][1]) == 3:
                break
            time.sleep(0.5)
        assert res and float(res[0]["value"][1]) == 3, res
    finally:
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
        if server is not None:
            server.stop()
        cluster.close()
