"""The restart-economy 120 s cells (issue 27's "decisions unchanged" check): every policy's
summary on 1,000 Poisson jobs, restart 120 s, 40 and 16 GPUs, seeds 1-5, to full precision
(``repr`` of each float), as ``benchmarks/sim/restart_economy.py``'s sweep computes them.

    python benchmarks/sim/economy_cells.py [--gpus 40,16] [--seeds 1,2,3,4,5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from restart_economy import POLICIES, cell  # noqa: E402

from miso.sim.traces import poisson_jobs  # noqa: E402
from miso.sim.world import WorldConfig  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "economy_cells.json"
#: Figures that are timings, not outcomes of decisions (left out)
TIMING = {"wall_s"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="40,16")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--policy", default=",".join(POLICIES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--check", action="store_true",
                    help=f"compare every figure with {RESULTS.name} (recorded at e8424d3; "
                         "miso+ re-recorded with the priced reserve, issue 30, and with one "
                         "restart price, issue 27)")
    a = ap.parse_args()
    out: dict[str, dict[str, dict[str, str]]] = {}
    for n in (int(x) for x in a.gpus.split(",")):
        for s in (int(x) for x in a.seeds.split(",")):
            t0 = time.process_time()
            c = cell(poisson_jobs(1000, seed=s), WorldConfig(n_gpus=n, restart_s=120.0), s,
                     policies=tuple(a.policy.split(",")))
            key = f"{n}/120/seed{s}"
            out[key] = {p: {k: repr(v) for k, v in sorted(m.items())
                            if isinstance(v, float | int) and k not in TIMING}
                        for p, m in c.items()}
            print(key, f"({time.process_time() - t0:.1f} s CPU)",
                  " ".join(f"{p}={m['avg_jct_s']}" for p, m in out[key].items()), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    if a.check:
        want = {k: {p: {f: x for f, x in m.items() if f not in TIMING} for p, m in v.items()}
                for k, v in json.loads(RESULTS.read_text()).items()}
        bad = [k for k, v in out.items() if want.get(k) != v]
        n = sum(len(m) for v in out.values() for m in v.values())
        print(f"{n} figures in {len(out)} cells: "
              + ("identical to full precision" if not bad else f"CHANGED in {bad}"))
        raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
