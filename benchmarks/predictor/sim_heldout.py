"""miso+ with a predictor that never saw the job's model family vs with true speeds (issue 19).

usage: PYTHONPATH=src python benchmarks/predictor/sim_heldout.py [--seeds 5] [--restart-s 60]

Runs `miso simulate` (1,000 Poisson jobs, 60 s mean inter-arrival) at 40 GPUs (the paper's
setting) and 16 GPUs (saturated) with ``--predictor true`` (no error), ``noisy`` (the paper's
Gaussian error) and ``heldout`` (real held-out-family prediction errors, see miso.sim.heldout)
and prints miso+'s mean average JCT over the seeds and the ratio to true speeds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def avg_jct(gpus: int, predictor: str, seed: int, restart_s: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        subprocess.run([sys.executable, "-m", "miso.cli", "simulate", "--gpus", str(gpus),
                        "--jobs", "1000", "--policies", "miso+", "--predictor", predictor,
                        "--seed", str(seed), "--restart-s", str(restart_s), "--json", str(out)],
                       check=True, capture_output=True)
        return float(json.loads(out.read_text())["policies"]["miso+"]["avg_jct_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--restart-s", type=float, default=60.0)
    args = ap.parse_args()
    print("| GPUs | true | noisy (paper) | heldout | noisy / true | heldout / true | "
          "heldout / true, worst seed |")
    print("|---|---|---|---|---|---|---|")
    for gpus in (40, 16):
        res = {p: [avg_jct(gpus, p, s, args.restart_s) for s in range(1, args.seeds + 1)]
               for p in ("true", "noisy", "heldout")}
        t, n, h = (np.mean(res[p]) for p in ("true", "noisy", "heldout"))
        worst = max(a / b for a, b in zip(res["heldout"], res["true"], strict=True))
        print(f"| {gpus} | {t:.0f} | {n:.0f} | {h:.0f} | {n / t:.3f} | {h / t:.3f} | "
              f"{worst:.3f} |", flush=True)


if __name__ == "__main__":
    main()
