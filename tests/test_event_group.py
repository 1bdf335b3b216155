"""The live loop's event groups (issue 32): the events waiting in its queue when it comes
round are handled in order in one turn, and the policy's placement pass (``on_capacity``),
which each completion would run over the queue's window, runs once, at the group's end
(:meth:`~miso.sched.driver.DriverStep.group`, ``BasePolicy.capacity`` / ``owed_pass``).

The simulator never groups (its decisions are pinned by tests/test_decision_hash.py); here:
a group of completions costs one pass and still places the queue; a pass owed by an event
is run even when the group's last event is stale; items of another kind (a cancel) keep
their place behind the events before them; and the decision log's records of one turn are
written out when it ends.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from helpers import AcceptingExecutor, DecisionRecorder

from miso.controller import Controller, ControllerConfig
from miso.controller.runtime import GpuRef
from miso.controller.store import JobStore
from miso.mig import geometry
from miso.observe import DecisionLog
from miso.sched import Decision, GpuAdded, JobFinished, JobSubmitted, PlaceJob, Tick
from miso.sched.clock import VirtualClock
from miso.sched.state import JobStatus
from miso.sim.engine import Simulator
from miso.sim.run import build_policy
from miso.sim.traces import TraceJob, poisson_jobs
from miso.sim.world import WorldConfig

CFG = WorldConfig(n_gpus=2, restart_s=30.0)


def _trace() -> list[TraceJob]:
    jobs = sorted(poisson_jobs(40, seed=5, mean_interarrival_s=4.0),
                  key=lambda j: (j.submit_s, int(j.id)))
    return [TraceJob(f"j{i + 1:04d}", j.submit_s, j.duration_s, j.workload)
            for i, j in enumerate(jobs)]


class _Counting:
    """Counts the policy's placement passes (``on_capacity`` calls)."""

    def __init__(self, policy: Any) -> None:
        self.calls = 0
        inner = policy.on_capacity

        def on_capacity(now: float, sc: Any) -> None:
            self.calls += 1
            inner(now, sc)
        policy.on_capacity = on_capacity


def _live_until_two_finish() -> tuple[Controller, DecisionRecorder, list[str], _Counting]:
    """miso+ on 2 GPUs, the simulator's stream replayed into the live loop one event at a
    time up to the first instant a job finishes while others wait; returns the controller,
    its recorder, two running jobs to finish, and the pass counter."""
    jobs = _trace()
    log = Simulator(build_policy("miso+", jobs, CFG, 3), jobs, CFG, seed=3,
                    record=True).run().log
    clock = VirtualClock()
    store = JobStore(":memory:")
    con = Controller(store, None, ControllerConfig(policy="miso+"),  # type: ignore[arg-type]
                     checkpoint_root="/nonexistent", clock=clock,
                     policy=build_policy("miso+", jobs, CFG, 3))
    rec = DecisionRecorder()
    con.observer = rec
    con.loop.executor = AcceptingExecutor()  # type: ignore[assignment]
    geom = geometry(CFG.gpu_model)
    st = con.loop.state
    for t, item in log:
        if isinstance(item, Decision):
            continue
        running = [j for j, js in st.jobs.items() if js.status == JobStatus.RUNNING]
        if isinstance(item, JobFinished) and len(st.queue) >= 2 and len(running) >= 2:
            inner = con.loop.policy
            counter = _Counting(getattr(inner, "inner", inner))
            return con, rec, running[:2], counter
        clock.advance_to(t)
        if isinstance(item, JobSubmitted):
            got = store.submit(command=["train"], name=item.job.name,
                               memory_gb=item.job.memory_gb, memory_gib=item.job.memory_gb,
                               workload=item.job.workload, at=t)
            assert got.id == item.job.id
        elif isinstance(item, Tick):
            con.loop.run_due()
            continue
        elif isinstance(item, GpuAdded):
            con.rt.gpus[item.gpu] = GpuRef(item.gpu, "n0", 0, item.model, geom)
        con.loop.handle(("event", item))
    raise AssertionError("the trace never had two running jobs and a queue")


def _placed(rec: DecisionRecorder, since: int) -> int:
    return sum(1 for _, d in rec.decisions[since:] if isinstance(d, PlaceJob))


def test_group__completions_waiting_together_cost_one_pass_and_place_the_queue() -> None:
    con, rec, (a, b), counter = _live_until_two_finish()
    n = len(rec.decisions)
    con.rt.queue.put(("event", JobFinished(a), time.monotonic()))
    con.rt.queue.put(("event", JobFinished(b), time.monotonic()))
    assert con.loop.run_once() and con.rt.queue.empty()  # both in one turn
    assert counter.calls == 1
    assert _placed(rec, n) >= 1  # the owed pass placed queued jobs in the room freed
    st = con.loop.state
    assert st.jobs[a].status == st.jobs[b].status == JobStatus.FINISHED
    assert not st.defer_capacity and st.capacity_owed is None
    assert not con.errors


def test_group__one_at_a_time_each_completion_runs_its_own_pass() -> None:
    """The same two completions as two turns: two passes (what the group saves)."""
    con, _rec, (a, b), counter = _live_until_two_finish()
    con.loop.handle(("event", JobFinished(a), time.monotonic()))
    con.loop.handle(("event", JobFinished(b), time.monotonic()))
    assert counter.calls == 2


def test_group__a_pass_owed_is_run_when_the_last_event_is_stale() -> None:
    """A completion, then a second report of it (stale: dropped before the policy): the
    pass the first one owed still runs at the group's end."""
    con, rec, (a, _b), counter = _live_until_two_finish()
    n = len(rec.decisions)
    con.rt.queue.put(("event", JobFinished(a), time.monotonic()))
    con.rt.queue.put(("event", JobFinished(a), time.monotonic()))
    assert con.loop.run_once() and con.rt.queue.empty()
    assert counter.calls == 1
    assert _placed(rec, n) >= 1


def test_group__a_cancel_keeps_its_place_behind_the_events_before_it() -> None:
    """[finish a, cancel b, finish c]: the first turn handles the completion before the
    cancel only; the cancel and what follows it stay queued, in order."""
    con, _rec, (a, b), _counter = _live_until_two_finish()
    done = threading.Event()
    con.rt.queue.put(("event", JobFinished(a), time.monotonic()))
    con.rt.queue.put(("cancel", b, done))
    con.rt.queue.put(("event", JobFinished("nonexistent"), time.monotonic()))
    assert con.loop.run_once()
    assert [it[0] for it in con.rt.queue.queue] == ["cancel", "event"]
    assert not done.is_set()
    assert con.loop.run_once() and done.is_set()


def test_group__decision_records_of_a_batch_are_written_when_it_ends(tmp_path: Any) -> None:
    log = DecisionLog(tmp_path / "d.jsonl")
    with log.batch():
        for i in range(3):
            log.append({"time": float(i), "kind": "x"})
        with log.batch():  # nested: written when the outer one ends
            log.append({"time": 3.0, "kind": "x"})
    lines = (tmp_path / "d.jsonl").read_text().splitlines()
    assert [json.loads(x)["seq"] for x in lines] == [1, 2, 3, 4]
    log.append({"time": 4.0, "kind": "x"})  # outside a batch: at once, as before
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 5
    log.close()


def test_group__headed_by_a_progress_report_still_refreshes_the_status_view() -> None:
    """[a progress report, a completion]: the snapshot the status reads drops the job
    from its GPU after the turn (a group of progress alone changes no view)."""
    con, _rec, (a, _b), _counter = _live_until_two_finish()
    gpu = con.loop.state.jobs[a].gpu
    assert a in json.dumps(con.loop.snapshot()["gpus"])
    con.rt.queue.put(("progress", "nobody", gpu, None, None, 1.0, 1.0))
    con.rt.queue.put(("event", JobFinished(a), time.monotonic()))
    assert con.loop.run_once() and con.rt.queue.empty()
    assert a not in json.dumps(con.loop.snapshot()["gpus"])


def test_group__a_reports_progress_is_one_item_queued_before_its_next_event() -> None:
    """An agent's report (Runtime.progress_batch): its jobs' progress is one queue item, put
    before an event the same report posts (the loop folds a job's progress before a speed
    event of the report that follows it, as with one item per job); a job whose report still
    waits is not queued again (the newer values replace it); the loop folds every job."""
    con, _rec, (a, b), _counter = _live_until_two_finish()
    st, rt = con.loop.state, con.rt
    ga, gb = st.jobs[a].gpu, st.jobs[b].gpu
    with rt.progress_batch():
        rt.post_progress(a, ga, st.jobs[a].placement, None, 100.0, 1.0)
        rt.post_progress(b, gb, st.jobs[b].placement, None, 200.0, 1.0)
        rt.post_event(Tick("after-a-b"))
        rt.post_progress(a, ga, st.jobs[a].placement, None, 50.0, 1.0)  # a still waits
    items = list(rt.queue.queue)
    assert [it[:2] for it in items] == [("progress", (a, b)), ("event", Tick("after-a-b"))]
    before = {j: st.jobs[j].progress for j in (a, b)}
    while con.loop.run_once():
        pass
    after = {j: st.jobs[j].progress for j in (a, b)}
    assert all(after[j] is not None and after[j] != before[j] for j in (a, b))
    assert after[a][1] < after[b][1]  # a's latest values (50 left, not 100) were folded
    assert not con.errors
