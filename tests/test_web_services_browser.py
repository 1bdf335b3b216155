"""Services on the web page, in a real browser (issue 29): Debian's headless Chromium driven by
Playwright against an emulated cluster with the service router and manager, as the head runs
them. A service under load shows its URL, rate, ready replicas and slices, p50/p99 against its
SLO, and three plots over time (rate, ready replicas, p99 vs SLO); a user who is not an admin
sees it only as a count. Slow (~30 s):

    python -m pytest -m slow tests/test_web_services_browser.py
"""

from __future__ import annotations

import contextlib
import getpass
import os
import sys
import threading
from pathlib import Path

import httpx
import pytest

from miso.api.app import create_app
from miso.api.server import ApiServer, Listen
from miso.api.services import services_router
from miso.api.users import UserStore
from miso.cluster.local import LocalCluster
from miso.controller import Controller, ControllerConfig, JobStore
from miso.controller.services import attach_services
from miso.observe import attach
from miso.observe.routes import api_routers

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason="needs Debian's chromium (apt-get install chromium)")]


def test_services_on_the_web_page_rate_replicas_and_p99_vs_slo(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    cfg = ControllerConfig(policy="miso", estimator="true", poll_interval=0.1,
                           checkpoint_timeout=5.0)
    cluster = LocalCluster(tmp_path / "c", gpus_per_node=2, config=cfg, rate_window=0.5,
                           start=False)
    server = mgr = None
    stop = threading.Event()
    shots = Path(os.environ.get("MISO_SCREENSHOT_DIR") or tmp_path)
    try:
        ctl = Controller(JobStore(tmp_path / "c" / "miso.db"), cluster.transport, cfg,
                         checkpoint_root=tmp_path / "c" / "checkpoints")
        obs = attach(ctl, tmp_path / "c")
        cluster.controller = ctl.start()
        mgr = attach_services(ctl, tmp_path / "c", obs, separate_process=False)
        users = UserStore(":memory:")
        token = users.add("ann", admin=True, unix_user=getpass.getuser(), operator=True)
        app = create_app(ctl, users, extra_routers=api_routers(ctl, obs)
                         + [services_router(mgr)])  # as the head does
        server = ApiServer(app, Listen("127.0.0.1", 0))
        url = server.start()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                           timeout=10)
        r = api.post("/api/v1/services", json={
            "name": "web-svc", "model": "resnet50", "slo_p99_ms": 100,
            "command": [sys.executable, "-m", "miso.emuserve", "--model", "resnet50",
                        "--load-s", "0.2"]})
        assert r.status_code == 201, r.text
        svc_url = r.json()["url"]

        def load() -> None:  # ~10 requests/s through the router
            with httpx.Client(timeout=10) as h:
                while not stop.is_set():
                    with contextlib.suppress(httpx.HTTPError):
                        h.post(svc_url + "/infer")
                    stop.wait(0.1)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.goto(url + "/")
            page.get_by_label("API token").fill(token)
            page.keyboard.press("Enter")
            row = page.locator("#services tbody tr", has_text="web-svc")
            row.wait_for(timeout=30_000)
            assert svc_url in row.inner_text()
            # the replica gets ready and serves: one of one ready on its slice, a rate, a p99
            page.locator("#services tbody tr", has_text="1 of 1 (").wait_for(timeout=60_000)
            page.wait_for_function(
                """() => { const c = document.querySelectorAll('#services tbody tr td');
                           return c.length && parseFloat(c[2].textContent) > 0
                                  && /\\d \\/ \\d/.test(c[4].textContent); }""",
                timeout=30_000)
            cells = row.locator("td").all_inner_texts()
            assert "(100)" in cells[4] and "gb)" in cells[3], cells
            # three plots over time, drawn once there are two samples, labelled in words
            plots = page.locator("#service-plots figure.plot")
            page.locator("#service-plots figure.plot polyline").first.wait_for(timeout=20_000)
            assert plots.count() == 3
            titles = " | ".join(plots.locator("h3").all_inner_texts())
            assert "Request rate" in titles and "Ready replicas" in titles and "SLO" in titles
            label = plots.nth(2).locator("svg").get_attribute("aria-label") or ""
            assert "web-svc p99" in label and "web-svc SLO 100" in label, label
            assert "web-svc: 1" in plots.nth(1).inner_text()
            shots.mkdir(parents=True, exist_ok=True)
            page.locator("#services-section").screenshot(path=str(shots / "web-services.png"))
            # a user who is not an admin sees another owner's service only as a count
            other = browser.new_page(viewport={"width": 1366, "height": 900})
            other.goto(url + "/")
            other.get_by_label("API token").fill(users.add("bob"))
            other.keyboard.press("Enter")
            other.locator("#services-others").wait_for(timeout=15_000)
            assert "Other owners run 1 service(s) with 1 replica(s)" in \
                other.locator("#services-others").inner_text()
            assert other.locator("#services tbody tr").count() == 0
            assert other.locator("#services-none").is_visible()
            browser.close()
        assert (shots / "web-services.png").stat().st_size > 5_000
    finally:
        stop.set()
        if server is not None:
            server.stop()
        if mgr is not None:
            mgr.close()
            mgr.server.stop()
        cluster.close()
