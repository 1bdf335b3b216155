"""The decision log end to end: ``miso simulate --events FILE`` writes it, ``miso events``
prints it (words and numbers, filters, JSON), the JSONL log survives torn lines, and the web
routes serve the page, the cluster view and the events (with an auth dependency)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from miso.cli import app
from miso.cli import app as app_cli
from miso.observe import DecisionLog, Metrics, Observer, read_records
from miso.observe.routes import make_app
from miso.observe.view import cluster_view

runner = CliRunner()


@pytest.fixture(scope="module")
def sim_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ev") / "events.jsonl"
    res = runner.invoke(app, ["simulate", "--gpus", "2", "--jobs", "12", "--policies",
                              "miso,miso+", "--mean-interarrival", "60", "--events", str(path)])
    assert res.exit_code == 0, res.output
    return path


def test_simulate_events__every_decision_logged_per_policy_with_reasons(sim_log: Path) -> None:
    recs = [json.loads(x) for x in sim_log.read_text().splitlines()]
    assert {r["policy"] for r in recs} == {"miso", "miso+"}
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    for r in recs:
        assert r["kind"] in ("PlaceJob", "StartProfiling", "ApplyLayout", "RequeueJob",
                             "WakeUp", "RunMps", "RepartitionDeclined")
        assert r["trigger"] and r["note"]
    # every job of each run was placed exactly once or more, never lost from the log
    for pol in ("miso", "miso+"):
        placed = {r["job"] for r in recs if r["policy"] == pol and r["kind"] == "PlaceJob"}
        assert placed == {str(i) for i in range(12)}
    lay = [r for r in recs if r["kind"] == "ApplyLayout" and len(r["jobs"]) > 1]
    assert lay and all(r["objective"] is not None for r in lay)
    for r in lay:
        # the objective is the sum of the predicted speeds of the chosen assignment
        tot = sum(r["speeds"][j][p.split("@")[0]] for j, p in r["assignment"].items())
        # (policies that weigh restart costs report the plain throughput beside it)
        assert r.get("throughput", r["objective"]) == pytest.approx(tot, abs=1e-3)


def test_events_cli__an_arrival_explained_in_words_and_numbers(sim_log: Path) -> None:
    recs = [json.loads(x) for x in sim_log.read_text().splitlines()]
    split = next(r for r in recs if r["policy"] == "miso" and r["kind"] == "ApplyLayout"
                 and len(r["jobs"]) > 1)
    job = split["jobs"][-1]
    res = runner.invoke(app, ["events", "--file", str(sim_log), "--policy", "miso",
                              "--job", job])
    assert res.exit_code == 0, res.output
    out = res.output
    assert f"place job {job}" in out and "[trigger: arrival of job" in out
    assert "predicted speed" in out and "objective" in out
    assert "maximises the total predicted speed" in out
    assert f"{split['objective']:.3f}" in out
    # filters: --gpu and --since keep only matching records; --json is machine-readable
    res = runner.invoke(app, ["events", "--file", str(sim_log), "--gpu", "gpu1", "--since",
                              "300", "--json"])
    got = json.loads(res.output)["events"]
    assert got and all(r["gpu"] == "gpu1" and r["time"] >= 300 for r in got)
    res = runner.invoke(app, ["events", "--file", str(sim_log), "--json", "--limit", "3"])
    assert len(json.loads(res.output)["events"]) == 3


def test_events_cli__missing_log_is_one_line_error(tmp_path: Path) -> None:
    res = runner.invoke(app, ["events", "--state-dir", str(tmp_path)])
    assert res.exit_code != 0
    assert "no decision log" in res.output and "Traceback" not in res.output


def test_decision_log__torn_last_line_skipped_and_numbering_continues(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    log = DecisionLog(p)
    log.append({"time": 1.0, "kind": "PlaceJob", "job": "1", "gpu": "g"})
    log.close()
    with open(p, "a") as fh:
        fh.write('{"seq": 2, "time": 2.0, "kind": "Pla')  # crash mid-write
    log = DecisionLog(p)
    rec = log.append({"time": 3.0, "kind": "PlaceJob", "job": "2", "gpu": "g"})
    log.close()
    assert rec["seq"] == 2
    assert (p.stat().st_mode & 0o777) == 0o600
    res = runner.invoke(app, ["events", "--file", str(p), "--json"])
    assert [r["job"] for r in json.loads(res.output)["events"]] == ["1", "2"]


class FakeSource:
    def __init__(self) -> None:
        self.snap = {
            "time": 100.0, "policy": "miso",
            "gpus": [{"id": "node0/0", "node": "node0", "model": "A100-40GB",
                      "phase": "running", "layout": ["4g.20gb@0", "3g.20gb@4"],
                      "assignment": {"1": "4g.20gb@0", "2": "3g.20gb@4"}, "mps_shares": {},
                      "jobs": ["1", "2"], "pending_plan": None}],
            "queue": ["3", "4"],
            "jobs": [
                {"id": "1", "name": "a", "state": "running", "iteration": 50, "total": 200,
                 "placement": "4g.20gb@0", "gpu": "node0/0", "submitted_at": 1.0,
                 "memory_gb": 5.0, "owner": "ann"},
                {"id": "2", "name": "b", "state": "running", "iteration": 10, "total": 10,
                 "placement": "3g.20gb@4", "gpu": "node0/0", "submitted_at": 2.0,
                 "memory_gb": 5.0, "owner": "bob"},
                {"id": "3", "name": "c", "state": "queued", "submitted_at": 40.0,
                 "memory_gb": 30.0, "owner": "ann"},
                {"id": "4", "name": "d", "state": "queued", "submitted_at": 50.0,
                 "memory_gb": 2.0, "owner": "ann"}]}

    def status(self) -> dict:
        return self.snap


def test_cluster_view__slices_on_placement_units_progress_and_wait_reasons() -> None:
    v = cluster_view(FakeSource().status())
    g = v["gpus"][0]
    assert g["units"] == 8
    assert [(s["profile"], s["start"], s["size"], s["job"]) for s in g["slices"]] == [
        ("4g.20gb", 0, 4, "1"), ("3g.20gb", 4, 4, "2")]
    jobs = {j["id"]: j for j in v["jobs"]}
    assert jobs["1"]["progress"] == pytest.approx(0.25)
    assert [q["id"] for q in v["queue"]] == ["3", "4"]
    assert v["queue"][0]["waited_s"] == pytest.approx(60.0)
    assert "30 GB" in v["queue"][0]["reason"]
    assert "behind job 3" in v["queue"][1]["reason"]
    assert jobs["4"]["wait_reason"] == v["queue"][1]["reason"]
    # the controller's own line on why a job waits comes first
    src = FakeSource()
    src.snap["jobs"][2]["why"] = "waits for a GPU with 30 GB free"
    v = cluster_view(src.status())
    assert v["queue"][0]["reason"] == "waits for a GPU with 30 GB free"
    assert {j["id"]: j for j in v["jobs"]}["3"]["wait_reason"] == v["queue"][0]["reason"]


def test_routes__page_static_events_cluster_metrics_with_auth() -> None:
    src = FakeSource()
    log = DecisionLog(None)
    log.append({"time": 5.0, "kind": "PlaceJob", "job": "1", "gpu": "node0/0",
                "trigger": "arrival", "cause": {"event": "JobSubmitted", "job": "1"},
                "note": "job 1 goes to node0/0"})
    obs = Observer(Metrics(status=src.status), log)

    def auth(request: Request) -> str:
        if request.headers.get("authorization") != "Bearer s3cret":
            raise HTTPException(401, "missing token")
        return "ann"

    client = TestClient(make_app(src, obs, auth=auth))
    page = client.get("/")
    assert page.status_code == 200 and "<title>miso cluster</title>" in page.text
    assert 'src="static/app.js"' in page.text and "http" not in page.text.split("<body>")[1]
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/../routes.py").status_code == 404
    assert client.get("/api/v1/cluster").status_code == 401
    assert client.get("/api/v1/events").status_code == 401
    h = {"Authorization": "Bearer s3cret"}
    v = client.get("/api/v1/cluster", headers=h).json()
    assert v["gpus"][0]["slices"][0]["job"] == "1"
    assert v["decisions"][0]["text"].startswith("t=")
    ev = client.get("/api/v1/events", headers=h, params={"job": "1"}).json()["events"]
    assert len(ev) == 1 and "job 1 goes to node0/0" in ev[0]["text"]
    assert client.get("/api/v1/events", headers=h, params={"job": "2"}).json()["events"] == []
    m = client.get("/metrics").text
    assert "miso_queue_length 2.0" in m
    assert 'miso_jobs{owner="ann",state="queued"} 2.0' in m
    assert 'miso_api_request_duration_seconds_count{method="GET",route="/api/v1/cluster",' \
           'status="200"} 1.0' in m


@pytest.fixture(autouse=True)
def no_login_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `miso login` config or API variables of the machine leak into these tests."""
    monkeypatch.setenv("MISO_CONFIG", str(tmp_path / "no-config.json"))
    for v in ("MISO_URL", "MISO_TOKEN", "MISO_STATE_DIR"):
        monkeypatch.delenv(v, raising=False)


def two_user_app(edit: Callable[[dict], None] | None = None
                 ) -> tuple[object, dict[str, str]]:
    """The API app with the observe routes as the head mounts them, over a fake controller
    holding ann's jobs 1, 3, 4 and bob's job 2 (``edit`` may change the snapshot first);
    tokens of ann, bob and admin root."""
    from miso.api.app import create_app
    from miso.api.users import UserStore
    from miso.observe.routes import api_routers

    src = FakeSource()
    if edit is not None:
        edit(src.snap)

    class Store:  # what owner_scope reads: the API's job store
        def jobs(self, owner: str | None = None) -> list:
            class R:
                def __init__(self, i: str) -> None:
                    self.id = i
            return [R(j["id"]) for j in src.snap["jobs"] if owner in (None, j["owner"])]

    src.store = Store()  # type: ignore[attr-defined]
    log = DecisionLog(None)
    log.append({"time": 9.0, "kind": "ApplyLayout", "gpu": "node0/0", "jobs": ["1", "2"],
                "plan_id": 2, "layout": ["4g.20gb@0", "3g.20gb@4"],
                "assignment": {"1": "4g.20gb@0", "2": "3g.20gb@4"}, "restarts": ["1"],
                "trigger": "arrival", "cause": {"event": "JobSubmitted", "job": "2"},
                "note": "moves job 1; starts job 2", "objective": 1.6})
    log.append({"time": 9.5, "kind": "PlaceJob", "job": "2", "gpu": "node0/0",
                "trigger": "arrival", "note": "job 2 goes to node0/0"})
    obs = Observer(Metrics(status=src.status), log)
    users = UserStore(":memory:")
    tokens = {"ann": users.add("ann"), "bob": users.add("bob"),
              "root": users.add("root", admin=True)}
    for j in src.snap["jobs"]:  # jobs belong to user ids; the name is kept for display
        j["owner_name"] = j["owner"]
        j["owner"] = users.get(j["owner"]).id
    return create_app(src, users, extra_routers=api_routers(src, obs)), tokens


def test_routes_with_api_users__others_jobs_masked_admin_sees_all() -> None:
    app, tok = two_user_app()
    ann, bob, root = tok["ann"], tok["bob"], tok["root"]
    client = TestClient(app)

    def get(path: str, token: str, **params: str) -> dict:
        r = client.get(path, headers={"Authorization": f"Bearer {token}"}, params=params)
        assert r.status_code == 200, r.text
        return r.json()

    assert client.get("/api/v1/cluster", headers={"Authorization": "Bearer nope"}
                      ).status_code == 401
    v = get("/api/v1/cluster", ann)
    assert {j["id"] for j in v["jobs"]} == {"1", "3", "4"}           # ann's own only
    assert [s["job"] for s in v["gpus"][0]["slices"]] == ["1", "other"]
    assert "bob" not in json.dumps(v) and '"b"' not in json.dumps(v)
    assert len(v["decisions"]) == 1                                  # bob's PlaceJob hidden
    d = v["decisions"][0]
    assert d["assignment"] == {"1": "4g.20gb@0", "other": "3g.20gb@4"}
    assert d["cause"]["job"] == "other" and "job 2" not in d["text"]
    assert get("/api/v1/events", ann, job="2")["events"] == []
    assert len(get("/api/v1/events", bob)["events"]) == 2
    full = get("/api/v1/cluster", root)
    assert {j["id"] for j in full["jobs"]} == {"1", "2", "3", "4"}
    assert [s["job"] for s in full["gpus"][0]["slices"]] == ["1", "2"]
    # /metrics needs a token, on a loopback listener too; others' jobs count as "other"
    assert client.get("/metrics").status_code == 401
    m = client.get("/metrics", headers={"Authorization": f"Bearer {ann}"}).text
    assert 'owner="ann"' in m and 'owner="other"' in m and "bob" not in m
    assert 'owner="bob"' in client.get("/metrics", headers={"Authorization": f"Bearer {root}"}
                                       ).text


def test_events_cli_through_the_api__a_user_sees_their_own_decisions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from miso.api.server import ApiServer, Listen

    app, tok = two_user_app()
    server = ApiServer(app, Listen("127.0.0.1", 0))
    url = server.start()
    try:
        monkeypatch.setenv("MISO_URL", url)
        monkeypatch.setenv("MISO_TOKEN", tok["ann"])
        res = runner.invoke(app_cli, ["events", "--json"])
        assert res.exit_code == 0, res.output
        got = json.loads(res.output)["events"]
        assert [r["kind"] for r in got] == ["ApplyLayout"]
        assert got[0]["assignment"] == {"1": "4g.20gb@0", "other": "3g.20gb@4"}
        res = runner.invoke(app_cli, ["events"])
        assert "MIG layout 4g.20gb@0 + 3g.20gb@4" in res.output and "job 2" not in res.output
        monkeypatch.setenv("MISO_TOKEN", "wrong")
        res = runner.invoke(app_cli, ["events"])
        assert res.exit_code != 0 and "invalid token" in res.output
    finally:
        server.stop()


def test_observer_fault_never_reaches_the_driver() -> None:
    from miso.sched import ClusterState, GpuAdded, JobSpec, JobSubmitted, PlaceJob

    obs = Observer(Metrics(), DecisionLog(None))
    obs.metrics.events = None  # type: ignore[assignment,union-attr]  # every event fails inside
    st = ClusterState()
    obs.on_event(0.0, GpuAdded("g", "A100-40GB"), st)          # no exception escapes
    st.observe(0.0, GpuAdded("g", "A100-40GB"))
    st.observe(0.0, JobSubmitted(JobSpec("1", "a", 4.0)))
    st.apply(0.0, PlaceJob("1", "g"))
    obs.metrics = None
    obs.on_decision(0.0, PlaceJob("1", "g"), st)
    assert obs.log is not None and obs.log.recent()[-1]["kind"] == "PlaceJob"


def test_decision_log__rotates_past_max_bytes_and_reads_both_files(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    with DecisionLog(p, max_bytes=2000) as log:
        for i in range(60):
            log.append({"time": float(i), "kind": "PlaceJob", "job": str(i), "gpu": "g",
                        "note": "x" * 40})
    old = p.with_name("d.jsonl.1")
    assert old.exists() and p.stat().st_size <= 2000 and old.stat().st_size <= 2000
    recs = read_records(p)
    # the latest records, in order, none torn; older ones rotated away
    seqs = [r["seq"] for r in recs]
    assert seqs == list(range(seqs[0], 61)) and 10 < len(seqs) < 60
    with DecisionLog(p, max_bytes=2000) as log:
        assert log.append({"time": 61.0, "kind": "WakeUp"})["seq"] == 61



def test_a_user_sees_every_busy_slice_busy_and_the_clusters_counts() -> None:
    """Another user's jobs are not idle slices: ann (no admin) sees each of bob's two slices
    with a job ("another user's job"), and the header's counts are the cluster's (issue 33)."""

    def two_of_bobs(snap: dict) -> None:  # bob's jobs 2 and 5 share the GPU with ann's 1
        g = snap["gpus"][0]
        g["layout"] = ["4g.20gb@0", "2g.10gb@4", "1g.5gb@6"]
        g["assignment"] = {"1": "4g.20gb@0", "2": "2g.10gb@4", "5": "1g.5gb@6"}
        g["jobs"] = ["1", "2", "5"]
        snap["jobs"].append({"id": "5", "name": "e", "state": "running", "iteration": 1,
                             "total": 10, "placement": "1g.5gb@6", "gpu": "node0/0",
                             "submitted_at": 3.0, "memory_gb": 2.0, "owner": "bob"})

    app, tok = two_user_app(two_of_bobs)
    client = TestClient(app)

    def get(token: str) -> dict:
        r = client.get("/api/v1/cluster", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        return r.json()

    root, ann = get(tok["root"]), get(tok["ann"])
    assert [s["job"] for s in root["gpus"][0]["slices"]] == ["1", "2", "5"]
    assert [s["job"] for s in ann["gpus"][0]["slices"]] == ["1", "other", "other"]
    assert [s["job_name"] for s in ann["gpus"][0]["slices"]][1:] == ["another user's job"] * 2
    assert ann["gpus"][0]["jobs"] == ["1", "other", "other"]
    assert ann["counts"] == root["counts"] == {"running": 3, "queued": 2}
    assert "bob" not in json.dumps(ann) and '"e"' not in json.dumps(ann)
