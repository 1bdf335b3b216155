"""The loop's placements reach the store in one transaction per turn (loopwrites.py)."""

from __future__ import annotations

from miso.controller.loopwrites import PlacedBuffer
from miso.controller.store import JobStore


def _store_with(n: int) -> tuple[JobStore, list[str]]:
    st = JobStore(":memory:")
    ids = [st.submit(command=["true"], name=f"j{i}", memory_gb=1.0).id for i in range(n)]
    return st, ids


def test_placements_written_on_flush_last_one_wins() -> None:
    st, (a, b) = _store_with(2)
    errors: list[str] = []
    buf = PlacedBuffer(st, errors.append)
    buf.add(a, "n0/0")
    buf.add(b, "n0/1")
    buf.add(a, "n1/3")  # placed again in the same turn: the later GPU is kept
    assert st.get(a).gpu is None  # not written before the flush
    buf.flush()
    assert (st.get(a).gpu, st.get(b).gpu) == ("n1/3", "n0/1")
    assert buf.placed == {} and errors == []


def test_terminal_jobs_are_not_placed() -> None:
    st, (a,) = _store_with(1)
    st.finish(a, "cancelled", at=1.0)
    buf = PlacedBuffer(st, lambda m: None)
    buf.add(a, "n0/0")
    buf.flush()
    assert st.get(a).gpu is None and st.get(a).state == "cancelled"


def test_a_failed_write_is_reported_not_raised() -> None:
    class Broken:
        def place_many(self, rows: dict[str, str]) -> None:
            raise OSError("disk full")

    errors: list[str] = []
    buf = PlacedBuffer(Broken(), errors.append)
    buf.add("1", "n0/0")
    buf.flush()
    assert errors and "disk full" in errors[0] and buf.placed == {}


def test_log_body_is_asdict() -> None:
    import dataclasses

    from miso.controller.loopwrites import log_body
    from miso.sched import JobFinished, PlaceJob, Tick
    from miso.sched.events import GpuAdded, JobCheckpointable, LayoutApplied

    samples = [JobFinished("7"), LayoutApplied("n0/1", 3), JobCheckpointable("7", True),
               GpuAdded("n0/0", "A100-40GB"), GpuAdded("n0/0", "A100-40GB", ("1g.5gb",), 535),
               PlaceJob("7", "n0/0"), PlaceJob("7", "n0/0", why={"order": ["a", "b"]}),
               Tick("x")]
    for x in samples:
        assert log_body(x) == dataclasses.asdict(x), x
    assert log_body("not a dataclass") == {"repr": "'not a dataclass'"}
    assert log_body(JobFinished) == {"repr": repr(JobFinished)}



def test_a_placed_jobs_row_is_written_before_its_gpu_plan_reaches_the_executor() -> None:
    """Crash consistency: the executor's workers launch what a plan places, so every job of a
    GPU's plan has its GPU in the store by the time the plan is handed over (a crash before
    the turn's flush then leaves only jobs that no worker started, which recovery requeues)."""
    from helpers import AcceptingExecutor

    from miso.controller import Controller, ControllerConfig
    from miso.controller.runtime import GpuRef
    from miso.controller.submitcheck import job_spec
    from miso.mig import geometry
    from miso.sched import GpuAdded, JobSubmitted
    from miso.sched.clock import VirtualClock

    store = JobStore(":memory:")
    con = Controller(store, None, ControllerConfig(policy="optsta"),  # type: ignore[arg-type]
                     checkpoint_root="/nonexistent", clock=VirtualClock())
    seen: list[dict[str, str | None]] = []

    class Recording(AcceptingExecutor):
        def submit(self, gpu: str, d: object) -> bool:
            gs = con.loop.state.gpus[gpu]  # the jobs the scheduler has on that GPU now
            seen.append({j: store.get(j).gpu for j in gs.jobs})
            return super().submit(gpu, d)

    con.loop.executor = Recording()  # type: ignore[assignment]
    con.rt.gpus["gpu0"] = GpuRef("gpu0", "n0", 0, "A100-40GB", geometry("A100-40GB"))
    con.loop.handle(("event", GpuAdded("gpu0", "A100-40GB")))
    for i in range(3):
        rec = store.submit(command=["train"], name=f"j{i}", memory_gb=1.0)
        con.loop.handle(("event", JobSubmitted(job_spec(rec))))
    assert any(seen), "no plan placed a job"
    assert all(g == "gpu0" for rows in seen for g in rows.values()), seen
    assert not con.errors


def test_held_plans_reach_the_executor_in_order_after_the_placements() -> None:
    """A turn's plans wait with its placements: one transaction for all the placements,
    then every plan handed over in the order decided, each seeing its jobs' rows placed."""
    st, (a, b) = _store_with(2)
    calls: list[str] = []
    handed: list[tuple[str, object, dict[str, str | None]]] = []

    class Counting:
        def place_many(self, rows: dict[str, str]) -> None:
            calls.append("place_many")
            st.place_many(rows)

    buf = PlacedBuffer(Counting(), lambda m: None,
                       lambda g, p: handed.append((g, p, {j: st.get(j).gpu for j in (a, b)})))
    buf.add(a, "n0/0")
    buf.hold("n0/0", "plan-1")
    buf.add(b, "n0/1")
    buf.hold("n0/1", "plan-2")
    assert handed == [] and st.get(a).gpu is None  # nothing before the flush
    buf.flush()
    assert calls == ["place_many"]
    assert [(g, p) for g, p, _ in handed] == [("n0/0", "plan-1"), ("n0/1", "plan-2")]
    assert all(rows == {a: "n0/0", b: "n0/1"} for _, _, rows in handed)
    buf.flush()  # nothing kept: no statement, nothing handed twice
    assert calls == ["place_many"] and len(handed) == 2


def test_the_log_write_runs_under_the_same_hold_of_the_store_lock() -> None:
    """flush(also=...): the placements and the event log written while the loop holds the
    store's lock once (JobStore.writing), the plans handed over after it is released."""
    st, (a,) = _store_with(1)
    seen: list[str] = []

    def log_write() -> None:
        assert st.db.lock._is_owned()  # type: ignore[attr-defined]  # still held
        seen.append("log")

    def submit(gpu: str, plan: object) -> None:
        assert not st.db.lock._is_owned()  # type: ignore[attr-defined]
        seen.append(f"plan {plan}")

    buf = PlacedBuffer(st, lambda m: None, submit)
    buf.add(a, "n0/0")
    buf.hold("n0/0", "p1")
    buf.flush(log_write)
    assert seen == ["log", "plan p1"] and st.get(a).gpu == "n0/0"
    buf.flush(log_write)  # the log alone (no placement kept) is still written
    assert seen == ["log", "plan p1", "log"]
