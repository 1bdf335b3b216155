"""Issue 31, the saturated cell: the experiment that keeps owners apart
(miso.sched.experiments.fairapart): an owner above its entitlement may not join a GPU a
protected owner's job runs on; with ``pack`` the protected owner's jobs stay on few GPUs."""

from __future__ import annotations

from miso.sched import GpuAdded, JobSpec, JobSubmitted
from miso.sched.decisions import PlaceJob
from miso.sched.experiments.fairapart import KeepApart, keep_apart_profile
from miso.sched.policies import PROFILES
from miso.sched.policies.base import Scratch
from miso.sched.policies.framework import ENTITLEMENT, Cycle, Filter
from miso.sched.state import ClusterState
from miso.sched.tenancyconfig import TenancyConfig


def _state(price: float | None = 0.05, light: tuple[str, ...] = ("g0",)) -> ClusterState:
    """Four A100s; owner h's 12 jobs on all four (above its entitlement: keep_margin 0.25),
    owner l's jobs placed on ``light`` (protected), one more of each queued."""
    st = ClusterState(TenancyConfig(fairness_price=price, keep_margin=0.25))
    for g in range(4):
        st.observe(0.0, GpuAdded(f"g{g}", "A100-40GB"))
    for i in range(40):
        st.observe(0.0, JobSubmitted(JobSpec(f"h{i}", "x", 4.0, owner="h")))
    for i in range(len(light) + 1):
        st.observe(1.0, JobSubmitted(JobSpec(f"l{i}", "x", 4.0, owner="l")))
    for i, g in enumerate(light):
        st.apply(1.0, PlaceJob(f"l{i}", g))
    for i in range(12):
        st.apply(1.0, PlaceJob(f"h{i}", f"g{i % 4}"))
    return st


def _cycle(st: ClusterState, *filters: Filter) -> Cycle:
    sc = Scratch(st)
    sc.cycle = Cycle(st.now, GpuAdded("gx", "A100-40GB"), st, sc, (ENTITLEMENT, *filters))
    return sc.cycle


def test_keep_apart__an_owner_above_its_entitlement_stays_off_a_protected_owners_gpu():
    st = _state()
    ten = st.tenancy
    assert ten is not None
    ents = Scratch(st).entitlements()
    assert ten.protected("l", ents) and not ten.protected("h", ents)
    on, off = _cycle(st, KeepApart()), _cycle(st)
    g0 = on.sc.jobs_on("g0")
    assert "l0" in g0
    # the rule off (the shipped filters): h's next job may join l0's GPU; on: it may not
    assert off.allowed("h30", "g0", g0)
    assert not on.allowed("h30", "g0", g0)
    assert "kept apart" in (on.why_not("h30", "g0", g0) or "")
    # elsewhere, and for the protected owner's own jobs, nothing changes
    assert on.allowed("h30", "g1", on.sc.jobs_on("g1"))
    assert on.allowed("l1", "g0", g0)


def test_keep_apart__pack_keeps_the_protected_owners_jobs_on_few_gpus():
    # l holds two jobs' slices (under a GPU): at most ceil(held) + 1 = 2 GPUs of its own
    st = _state(light=("g0", "g1"))
    cy = _cycle(st, KeepApart(block=False, pack=1.0))
    assert cy.allowed("l2", "g0", cy.sc.jobs_on("g0"))
    assert not cy.allowed("l2", "g2", cy.sc.jobs_on("g2"))
    # block off: h's job may join l's GPU
    assert cy.allowed("h30", "g0", cy.sc.jobs_on("g0"))


def test_keep_apart__inactive_without_a_stated_price():
    st = _state(price=None)
    cy = _cycle(st, KeepApart())
    assert [f.name for f in cy.filters] == ["entitlement"]


def test_keep_apart_profile__miso_plus_with_the_filter_after_its_own():
    prof = keep_apart_profile()
    assert prof.name == "miso+/keep-apart"
    assert prof.filters == (*PROFILES["miso+"].filters, KeepApart())
    assert not any(isinstance(f, KeepApart) for f in PROFILES["miso+"].filters)  # not shipped
