"""miso+'s headroom priced (miso.sched.reservecost): kept only when the work an idle slice
costs until the next arrival is less than the restarts it avoids (hand-computed)."""

from __future__ import annotations

from miso.mig import Placement
from miso.sched.reservecost import headroom_pays

SPEEDS = {"a": {"7g.40gb": 1.0, "4g.20gb": 0.8, "3g.20gb": 0.7, "2g.10gb": 0.5},
          "b": {"7g.40gb": 1.0, "4g.20gb": 0.9, "3g.20gb": 0.8, "2g.10gb": 0.6}}
# Without headroom a and b share 4g + 3g (throughput 0.8 + 0.8 = 1.6); with a 2g slice kept
# free, a keeps 4g and b moves to 2g (0.8 + 0.6 = 1.4): 0.2 of a GPU idles until the next
# arrival. Without headroom that arrival would restart b (b's slice differs): 60 s at 0.8.
PLAIN = {"a": Placement(0, "4g.20gb"), "b": Placement(4, "3g.20gb")}
KEPT = {"a": Placement(0, "4g.20gb"), "b": Placement(4, "2g.10gb")}


def test_headroom_kept_when_the_next_arrival_is_near():
    # 0.2 x 200 s = 40 GPU-s idled < 60 s x 0.8 = 48 GPU-s of restart
    assert headroom_pays(["a", "b"], SPEEDS, PLAIN, KEPT, 200.0, lambda j: 60.0)


def test_headroom_dropped_when_the_next_arrival_is_far():
    # 0.2 x 300 s = 60 GPU-s idled > 48 GPU-s of restart
    assert not headroom_pays(["a", "b"], SPEEDS, PLAIN, KEPT, 300.0, lambda j: 60.0)
    # the same plan (no one moves): nothing to save, any idle slice costs
    assert not headroom_pays(["a", "b"], SPEEDS, PLAIN, PLAIN, 10.0, lambda j: 60.0)
