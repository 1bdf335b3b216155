"""Whether a slice kept free for the next arrival pays for the work it idles (miso+'s
``reserve``).

miso+ may keep a slice of a GPU free for the next newcomer so that its arrival restarts
nobody. The slice is not free: until the newcomer comes the residents run on smaller slices
than the best plan gives them. On a stream of hours-long jobs arriving minutes apart the next
arrival on a given GPU is an hour or more away, and the residents lose far more work to the
idle slice than the restarts it avoids would cost (measured: miso+ 2.0-4.3 % worse with it
than without, benchmarks/README.md "Headroom priced"). So the slice is kept only when

    (throughput of the residents without headroom - with it) x expected wait for the next
    arrival on this GPU  <  the work the avoided restarts would throw away

where the wait is the arrival clock's mean gap times the GPUs (arrivals spread over them, the
rule that decided to keep headroom at all), and the avoided restarts are the residents whose
slice differs between the two plans (without headroom, the newcomer's arrival moves them into
the headroom plan's slices), each losing its restart cost at its speed. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from miso.mig import Placement


def headroom_pays(jobs: list[str], speeds: Mapping[str, Mapping[str, float]],
                  plain: Mapping[str, Placement], kept: Mapping[str, Placement],
                  wait_s: float, restart_cost: Callable[[str], float]) -> bool:
    """Whether the headroom plan ``kept`` (the residents' slices beside the free one) is worth
    its idle slice against the plan without it, ``plain``, when the next arrival on this GPU
    is ``wait_s`` seconds away (see the module docstring)."""
    lost = 0.0
    saved = 0.0
    for j in jobs:
        a, b = plain.get(j), kept.get(j)
        if a is None or b is None:
            continue
        sa, sb = speeds[j].get(a.profile, 0.0), speeds[j].get(b.profile, 0.0)
        lost += (sa - sb) * wait_s
        if a != b:
            saved += restart_cost(j) * sa
    return lost < saved
