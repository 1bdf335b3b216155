"""The web page in a real browser: Debian's headless Chromium driven by Playwright (the system
browser; nothing is downloaded, ``playwright install`` is never run) against a running emulated
cluster served by the API app with the observe routes mounted, on 127.0.0.1.

The page asks for the token, shows each GPU's slices, a job submitted through the API appears
and its progress advances, a decision's explanation is visible, the plots over time are
drawn, and a user who is not an admin sees the admin's slices busy with the cluster's counts.
A screenshot goes to ``$MISO_SCREENSHOT_DIR`` (default: the test's temp dir; ``docs/`` for
the README's). Slow:

    apt-get install -y chromium && pip install -e ".[browser]"
    MISO_SCREENSHOT_DIR=docs python -m pytest -m slow tests/test_web_browser.py
"""

from __future__ import annotations

import getpass
import os
import time
from pathlib import Path

import httpx
import pytest
from helpers import emu

from miso.api.app import create_app
from miso.api.server import ApiServer, Listen
from miso.api.users import UserStore
from miso.cluster.local import LocalCluster
from miso.controller import Controller, ControllerConfig, JobStore
from miso.observe import attach
from miso.observe.routes import api_routers, instrument

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason="needs Debian's chromium (apt-get install chromium)")]


# The lowest WCAG contrast ratio of the elements matching each selector (text colour against
# the first opaque background up the tree).
CONTRAST_JS = """(sels) => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const bg = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const out = {};
  for (const s of sels) {
    let worst = 99;
    for (const el of document.querySelectorAll(s)) {
      const a = lum(rgb(getComputedStyle(el).color).slice(0, 3)), b = lum(bg(el));
      worst = Math.min(worst, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05));
    }
    if (worst < 99) out[s] = Math.round(worst * 100) / 100;
  }
  return out;
}"""



def test_web_page_in_chromium__gpus_jobs_progress_and_explanations(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    cfg = ControllerConfig(policy="miso", estimator="true", poll_interval=0.1,
                           checkpoint_timeout=5.0)
    cluster = LocalCluster(tmp_path / "c", gpus_per_node=1, config=cfg, rate_window=0.5,
                           start=False)
    server = None
    shots = Path(os.environ.get("MISO_SCREENSHOT_DIR") or tmp_path)
    try:
        ctl = Controller(JobStore(tmp_path / "c" / "miso.db"), cluster.transport, cfg,
                         checkpoint_root=tmp_path / "c" / "checkpoints")
        obs = attach(ctl, tmp_path / "c")
        cluster.controller = ctl.start()
        users = UserStore(":memory:")
        # jobs run as their owner's Unix account when the agent is root: this test's own
        token = users.add("ann", admin=True, unix_user=getpass.getuser(), operator=True)
        app = create_app(ctl, users, extra_routers=api_routers(ctl, obs))  # as the head does
        instrument(app, obs)
        server = ApiServer(app, Listen("127.0.0.1", 0))
        url = server.start()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                           timeout=10)

        def submit(name: str, wl: str, work_s: float) -> str:
            r = api.post("/api/v1/jobs", json={"command": emu(wl, work_s, ips=20.0), "name": name})
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.goto(url + "/")
            # no token yet: the page asks for one (labelled field), keyboard only
            page.get_by_label("API token").wait_for(timeout=15_000)
            # ... and says where to find it
            where = page.locator("#token-where")
            assert where.is_visible() and "operator.token" in where.inner_text()
            page.get_by_label("API token").fill(token)
            page.keyboard.press("Enter")
            page.locator("article.gpu").first.wait_for(timeout=15_000)
            assert page.locator("#token-form").is_hidden()
            # an empty queue is said in words, not as a numbered "1. empty"
            page.locator("#queue-empty").wait_for(timeout=10_000)
            assert page.locator("#queue li").count() == 0
            a = submit("resnet", "resnet_train128", 90)
            row = page.locator("#jobs tbody tr", has_text="resnet")
            row.wait_for(timeout=20_000)
            # the job runs alone: the GPU shows one 7g slice holding it
            page.locator(".slice", has_text=f"job {a}").wait_for(timeout=30_000)
            bar = row.locator("progress")
            bar.wait_for(timeout=30_000)
            v0 = float(bar.get_attribute("value") or 0)
            deadline = time.time() + 30
            v1 = v0
            while time.time() < deadline and v1 <= v0:
                time.sleep(0.5)
                v1 = float(row.locator("progress").get_attribute("value") or 0)
            assert v1 > v0, (v0, v1)
            # the progress bar and its percentage stay on one line
            assert row.locator("td.nowrap").evaluate(
                """td => { const bar = td.querySelector("progress").getBoundingClientRect();
                           const r = document.createRange();
                           r.selectNode(td.querySelector("span").lastChild);
                           const t = r.getBoundingClientRect();
                           return t.top < bar.bottom && t.left >= bar.right; }""")
            # it/s and the relative speed are two columns, one unit each
            cells = row.locator("td").all_inner_texts()
            heads = page.locator("#jobs th").all_inner_texts()
            assert not any("it/s" in c for c in cells), cells
            assert "waiting because" not in [" ".join(h.split()) for h in heads]
            # a second job splits the GPU: two slices, each with its job, and the decision
            # that split it explained in words and numbers
            b = submit("bert", "bert_train2", 90)
            page.locator(".slice", has_text=f"job {b}").wait_for(timeout=40_000)
            page.locator(".slice", has_text=f"job {a}").wait_for(timeout=40_000)
            assert page.locator("article.gpu .slice").count() == 2
            dec = page.locator("details.decision", has_text="ApplyLayout").first
            dec.wait_for(timeout=20_000)
            if not dec.evaluate("d => d.open"):
                dec.locator("summary").focus()
                page.keyboard.press("Enter")
            text = dec.locator("pre")
            text.wait_for(state="visible", timeout=10_000)
            assert "maximises the total predicted speed" in text.inner_text()
            assert "expected gain" in text.inner_text()
            # keyboard: the pause switch works from the keyboard and says its state
            page.locator("#pause").focus()
            page.keyboard.press("Space")
            assert page.locator("#pause").get_attribute("aria-pressed") == "true"
            page.keyboard.press("Space")
            assert page.locator("#pause").get_attribute("aria-pressed") == "false"
            # plots over time (issue 33): GPU utilisation and queue length, drawn as lines
            # once the page has two samples, each chart labelled in words for screen readers
            page.locator("figure.plot polyline").first.wait_for(timeout=20_000)
            assert page.locator("figure.plot").count() == 3  # GPUs, queue, owners' shares
            assert "ann: 100%" in page.locator("figure.plot").nth(2).inner_text()
            label = page.locator("figure.plot svg").first.get_attribute("aria-label") or ""
            assert "GPU utilisation" in label and "%" in label, label
            # contrast: every kind of text on the page against its background, WCAG AA
            worst = page.evaluate(CONTRAST_JS, [
                "h1", ".help", "#summary", ".phase", ".slice .prof", ".slice .job", "th",
                "td", ".decision summary", ".decision pre", "button", ".gpu .meta",
                ".plot h3", ".plot .legend li"])
            assert len(worst) == 14 and all(r >= 4.5 for r in worst.values()), worst
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "web-page.png"), full_page=True)
            # a user who is not an admin sees ann's two slices busy, not idle, and the
            # header counts the cluster's jobs, not only the reader's (issue 33)
            other = browser.new_page(viewport={"width": 1366, "height": 900})
            other.goto(url + "/")
            other.get_by_label("API token").fill(users.add("bob"))
            other.keyboard.press("Enter")
            other.locator("article.gpu").first.wait_for(timeout=15_000)
            slices = other.locator("article.gpu .slice")
            assert slices.count() == 2
            assert slices.all_inner_texts() and all(
                "another user's job" in t for t in slices.all_inner_texts())
            assert other.locator("article.gpu .slice.empty").count() == 0
            assert "2 running" in other.locator("#summary").inner_text()
            browser.close()
        assert (shots / "web-page.png").stat().st_size > 10_000
    finally:
        if server is not None:
            server.stop()
        cluster.close()
