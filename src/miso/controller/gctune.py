"""The controller process's garbage collector, tuned once at start-up.

A controller holding 10,000 jobs keeps hundreds of thousands of long-lived container objects
(job states, specs, store rows, GPU views). With CPython's default thresholds (700, 10, 10) a
full collection walks all of them every few hundred thousand allocations: at 1,024 GPUs x
10,000 jobs the scale harness saw 56-66 full collections of 0.2-0.38 s each per run, during
which every thread (the scheduling loop, the pollers, the API) stands still. So, once per
process, after start-up:

* :func:`gc.freeze` moves everything alive then (modules, the API's routes, the recovered
  state) out of the collector's sight: never walked again (reference counting still frees
  it; only a cycle among those objects that becomes garbage later would be kept);
* the young generation is collected every :data:`GEN0` allocations instead of 700, and a
  full collection needs :data:`GEN2` middle collections instead of 10 (CPython also waits
  until the objects promoted since the last full collection are 25 % of the old ones).

Reference counting frees almost everything the controller drops; the collector only finds
cycles, so collecting them later costs memory briefly, never correctness. ``MISO_GC_TUNE=0``
in the environment keeps CPython's defaults (an A/B, or a process embedding the controller
that tunes its collector itself).
"""

from __future__ import annotations

import gc
import os
import threading

#: Allocations (net, of container objects) between young collections (CPython: 700).
GEN0 = 50_000
#: Young collections between middle ones (CPython: 10).
GEN1 = 20
#: Middle collections between full ones (CPython: 10).
GEN2 = 100

_done = threading.Event()


def tune_gc() -> bool:
    """Freeze what is alive and raise the thresholds, once per process (a second call, e.g.
    a second controller in a test process, does nothing); False when already done."""
    if _done.is_set() or os.environ.get("MISO_GC_TUNE", "1") == "0":
        return False
    _done.set()
    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
    return True
