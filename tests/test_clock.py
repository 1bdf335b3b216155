"""The one clock: virtual time for the simulator and tests, timers of the live loop on it."""

from __future__ import annotations

import time

from miso.controller import Controller, ControllerConfig
from miso.controller.store import JobStore
from miso.sched import ClusterState, GpuAdded, Tick, WakeUp
from miso.sched.clock import VirtualClock, WallClock


def test_virtual_clock__moves_only_when_told_and_keeps_insertion_order_on_ties(
        virtual_clock: VirtualClock):
    c = virtual_clock
    c.at(5.0, "b")
    c.at(2.0, "a")
    c.at(5.0, "c")
    assert c.now() == 0.0 and c.due() == []
    c.advance(5.0)
    assert [x for _, x in c.due()] == ["a", "b", "c"]
    c.at(1.0, "late")          # in the past: due at once, time does not go back
    assert c.pop() == (1.0, "late") and c.now() == 5.0
    assert c.pop() is None


def test_wall_clock__counts_from_its_epoch():
    c = WallClock(time.time() - 100.0)
    assert 99.0 < c.now() < 110.0
    c.at(c.now() - 1.0, "x")
    assert [x for _, x in c.due()] == ["x"]


class _Waker:
    """A policy that asks for a timer at every GpuAdded and records the ticks it gets."""

    name = "waker"

    def __init__(self) -> None:
        self.ticks: list[tuple[float, str]] = []

    def decide(self, now: float, ev: object, state: ClusterState) -> list:
        if isinstance(ev, GpuAdded):
            return [WakeUp(now + 600.0, "cool-down")]
        if isinstance(ev, Tick):
            self.ticks.append((now, ev.tag))
        return []


def test_live_loop__policy_timers_fire_on_the_virtual_clock_without_sleeping(
        virtual_clock: VirtualClock):
    pol = _Waker()
    con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                     ControllerConfig(policy="nopart"), checkpoint_root="/nonexistent",
                     clock=virtual_clock, policy=pol)  # type: ignore[arg-type]
    t0 = time.monotonic()
    con.loop.handle(("event", GpuAdded("g0", "A100-40GB")))
    virtual_clock.advance(599.0)
    assert not con.loop.run_once() and pol.ticks == []
    virtual_clock.advance(1.0)
    assert con.loop.run_once()
    assert pol.ticks == [(600.0, "cool-down")]
    assert time.monotonic() - t0 < 5.0   # ten virtual minutes, no real wait


def test_live_loop__a_lost_node_waits_for_its_lease_on_the_clock(virtual_clock: VirtualClock):
    """The lease (wall time, read by the agent) ends 300 s from now: the loop defers the
    node's requeue on its clock and handles it when that much time has passed there."""
    con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                     ControllerConfig(policy="nopart"), checkpoint_root="/nonexistent",
                     clock=virtual_clock)
    con.rt.fencing.add("n0")          # the poller declared it lost (see AgentPoller)
    con.rt.queue.put(("node_lost", "n0", time.time() + 300.0))
    con.loop.run_once()
    assert "n0" in con.rt.fencing and virtual_clock.next_at() is not None
    virtual_clock.advance(299.0)
    con.loop.run_once()
    assert "n0" in con.rt.fencing     # its jobs may still run there
    virtual_clock.advance(2.0)
    con.loop.run_once()
    assert "n0" not in con.rt.fencing  # handled: its jobs requeued, the node forgotten
