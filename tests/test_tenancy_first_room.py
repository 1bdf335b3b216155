"""Fair share takes the first room that frees, on the live loop driven by hand (issue 31's
live target, tests/test_tenancy_live.py, without agents or timing): user A fills two GPUs
and queues more, user B submits one job, then A's jobs end. The completions waiting
together in the loop's queue (one agent report, or several while the loop was busy) are
one turn whose placement pass runs once, at its end (tests/test_event_group.py): that pass
places B's job before any of A's, however many completions it follows."""

from __future__ import annotations

import time

import pytest
from helpers import AcceptingPlans, TurnRecorder

from miso.controller import Controller, ControllerConfig
from miso.controller.runtime import GpuRef
from miso.controller.store import JobStore
from miso.mig import geometry
from miso.sched import GpuAdded, JobFinished, LayoutApplied, make_policy
from miso.sched.clock import VirtualClock
from miso.sched.state import JobStatus
from miso.sched.tenancyconfig import TenancyConfig


def _full_cluster(policy: str) -> tuple[Controller, TurnRecorder, list[str], str]:
    """``policy`` with fair share on 2 A100-40GB, A's 30 jobs submitted (the GPUs full, the
    rest queued, every plan applied), then B's one job, queued; returns the controller, its
    turn recorder, A's jobs and B's."""
    clock = VirtualClock()
    con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                     ControllerConfig(policy=policy, tenancy=TenancyConfig(),
                                      check_commands=False),
                     checkpoint_root="/nonexistent", clock=clock,
                     policy=make_policy(policy) if policy == "nopart" else None)
    con.loop.executor = AcceptingPlans()  # type: ignore[assignment]
    turns = TurnRecorder()
    con.observer = turns
    for i in range(2):
        con.rt.gpus[f"g{i}"] = GpuRef(f"g{i}", "n0", i, "A100-40GB", geometry("A100-40GB"))
        con.loop.handle(("event", GpuAdded(f"g{i}", "A100-40GB")))

    def settle() -> None:  # every turn handled, every plan applied, the timers fired
        for _ in range(5):
            while con.loop.run_once():
                pass
            for g in con.loop.snapshot()["gpus"]:
                if g["pending_plan"] is not None:
                    con.rt.queue.put(("event", LayoutApplied(g["id"], g["pending_plan"]),
                                      time.monotonic()))
            clock.advance(1.0)

    a = [con.submit(["train"], memory_gb=9.7, owner="u:a", owner_name="alice")
         for _ in range(30)]
    settle()
    st = con.loop.state
    assert all(g.jobs and g.pending is None for g in st.gpus.values())
    b = con.submit(["train"], memory_gb=9.7, owner="u:b", owner_name="bob")
    settle()
    assert st.jobs[b].gpu is None  # full: B waits
    return con, turns, a, b


@pytest.mark.parametrize("together", [1, 2])
@pytest.mark.parametrize("policy", ["nopart", "miso+"])
def test_fair_share__the_turn_of_the_first_completions_places_b_before_a(
        policy: str, together: int) -> None:
    con, turns, a, b = _full_cluster(policy)
    st = con.loop.state
    running = [j for j in a if st.jobs[j].status == JobStatus.RUNNING]
    assert len(running) >= 2
    n = len(turns.seen)
    for j in running[:together]:  # they end within one poll: they wait together
        con.rt.queue.put(("event", JobFinished(j), time.monotonic()))
    assert con.loop.run_once() and con.rt.queue.empty()  # one turn
    seen = turns.seen[n:]
    assert len({t for t, *_ in seen}) == 1
    assert [job for _, _, kind, job in seen if kind == "JobFinished"] == running[:together]
    placed = [job for _, _, kind, job in seen if kind == "decision:PlaceJob"]
    assert placed and placed[0] == b  # B first; A's next ones (if room) after it
    assert st.jobs[b].gpu is not None and not con.errors
