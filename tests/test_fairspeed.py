"""Issue 31: fair slices sized by speed (miso.sched.fairspeed, miso+'s speed floor): a
protected owner's running job that loses speed on small slices (large memory: large
transformers, bert, cyclegan in the catalogue) is owed a larger slice; a small one keeps its
owed size; never lowered; a queued job is placed at its unraised fair slice."""

from __future__ import annotations

from miso.mig import Placement, geometry
from miso.sched import GpuAdded, JobSpec, JobSubmitted, LayoutApplied
from miso.sched.decisions import ApplyLayout, PlaceJob
from miso.sched.fairspeed import SpeedFloor, speed_floor
from miso.sched.policies import PROFILES
from miso.sched.policies.base import Scratch
from miso.sched.policies.framework import Cycle, Entitlement
from miso.sched.state import ClusterState
from miso.sched.tenancyconfig import TenancyConfig

G = geometry("A100-40GB")
FROM_4G = frozenset({"4g.20gb", "7g.40gb"})
FROM_2G = frozenset({"2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"})


def test_speed_floor__a_large_memory_job_is_owed_more_a_small_one_keeps_its_size():
    # 17.5 GB (a large transformer's memory): its memory prior runs 0.58 of the whole GPU on
    # 4g, under 0.9 x the catalogue's 0.77 there: owed the whole GPU
    assert speed_floor(G, FROM_4G, 17.5, "transformer_train128") == {"7g.40gb"}
    # 4.8 GB: 0.81-0.84 on 4g, over 0.69: keeps 4g
    assert speed_floor(G, FROM_4G, 4.8, "resnet_train64") == FROM_4G
    # owed 2g at saturation: a 9.5 GB job (0.35 on 2g, under 0.9 x 0.53) is owed 3g and up
    assert speed_floor(G, FROM_2G, 9.5, "transformer_train64") == FROM_2G - {"2g.10gb"}
    # a job of no known workload is judged by its memory alone, like any other
    assert speed_floor(G, FROM_4G, 17.5, "") == {"7g.40gb"}


def test_speed_floor__never_lowers_and_asks_at_most_the_whole_gpu():
    # a part beyond any slice's speed asks for the whole GPU's, which it reaches
    assert speed_floor(G, FROM_4G, 4.8, "resnet_train64", part=5.0) == {"7g.40gb"}
    # a part of 0: everything owed reaches it, nothing smaller is added
    assert speed_floor(G, FROM_4G, 4.8, "resnet_train64", part=0.0) == FROM_4G


def _state(memory_gb: float, price: float | None, heavy: int = 20,
           running: bool = True) -> ClusterState:
    """8 A100s, ``heavy`` queued jobs of owner h and one job l0 of owner l (its only job):
    running on a 4g slice of g7 (``running``) or queued."""
    st = ClusterState(TenancyConfig(fairness_price=price, demand_per_job=4 / 7))
    for g in range(8):
        st.observe(0.0, GpuAdded(f"g{g}", "A100-40GB"))
    for i in range(heavy):       # 20: 2.6 active jobs per GPU, backlogged, the cap a 4g slice
        st.observe(i / 10, JobSubmitted(JobSpec(f"h{i}", "x", 4.8, owner="h")))
    st.observe(30.0, JobSubmitted(JobSpec("l0", "x", memory_gb, owner="l")))
    if running:
        four = Placement(0, "4g.20gb")
        st.apply(30.0, PlaceJob("l0", "g7"))
        pid = st.new_plan_id()
        st.apply(30.0, ApplyLayout("g7", pid, (four, Placement(4, "3g.20gb")), {"l0": four}))
        st.observe(31.0, LayoutApplied("g7", pid))
    return st


def _owed(st: ClusterState, filters: tuple[Entitlement, ...]) -> frozenset[str] | None:
    sc = Scratch(st)
    sc.cycle = Cycle(st.now, GpuAdded("gx", "A100-40GB"), st, sc, filters)
    sc.entitlements()
    return sc.fair.fair_slices(st.gpus["g0"].geom, "l", "l0")


PLAIN = (Entitlement(),)
FLOORED = (Entitlement(floors=(SpeedFloor(),)),)


def test_entitlement_filter__its_speed_floor_raises_a_running_protected_jobs_fair_slice():
    big, small = _state(17.5, 0.05), _state(4.8, 0.05)
    assert big.jobs["l0"].status.value == "running"
    assert _owed(big, PLAIN) == FROM_4G
    assert _owed(big, FLOORED) == {"7g.40gb"}
    assert _owed(small, FLOORED) == _owed(small, PLAIN) == FROM_4G
    # without a stated price the plugin does nothing
    none = _state(17.5, None)
    assert _owed(none, FLOORED) == _owed(none, PLAIN)


def test_entitlement_filter__a_queued_job_is_placed_at_its_unraised_fair_slice():
    """Owed at placement, a raised slice makes a queued job wait for a GPU where it fits
    (Philly by vc at 5 %, seed 2: +1.51 -> +4.06 %); only a running job is raised."""
    st = _state(17.5, 0.05, running=False)
    assert st.jobs["l0"].status.value == "queued"
    assert _owed(st, FLOORED) == _owed(st, PLAIN) == FROM_4G


def test_entitlement_filter__no_speed_floor_in_a_queue():
    """Saturated (25 active jobs per GPU: the packed share is under the smallest slice) the
    plugin raises nothing: a job owed a whole GPU waits for one (Philly by vc's short jobs)."""
    st = _state(17.5, 0.05, heavy=200)
    owed = _owed(st, FLOORED)
    assert owed == _owed(st, PLAIN) and owed != {"7g.40gb"}


def test_miso_plus__its_entitlement_filter_carries_the_speed_floor_and_only_its():
    def floors(name: str) -> list[object]:
        return [p for f in PROFILES[name].filters if isinstance(f, Entitlement) for p in f.floors]

    assert floors("miso+") == [SpeedFloor()]
    assert floors("miso") == []
    assert [f.name for f in PROFILES["miso+"].filters] == [f.name for f in PROFILES["miso"].filters]
