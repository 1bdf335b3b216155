"""Write ``src/miso/data/predictor/heldout_predictions.npz``: what a model that never saw a job's
model family predicts for it, on real MISO mixes (for ``miso simulate --predictor heldout``).

usage: PYTHONPATH=src python benchmarks/predictor/heldout_predictions.py [--data NPZ] [--out F]

Leave-one-family-out with the shipped per-job configuration (one sample per mix): every real
column of a held-out family gets the 4g/3g speeds predicted by the model trained without the
family. Stored per column: the workload name index and the two predicted speeds (float32).
Data: MISO (SoCC'22, Baolin Li et al.) MPS/MIG pairs, MIT licence.
"""

from __future__ import annotations

import argparse

import numpy as np

from miso.predict.data import catalogue_mig_columns, load_pairs
from miso.predict.heldout import clip_speeds, heldout_residuals


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/miso-a100/mps_mig_pairs.npz")
    ap.add_argument("--out", default="src/miso/data/predictor/heldout_predictions.npz")
    args = ap.parse_args()
    ho = heldout_residuals(load_pairs(args.data))
    names, _ = catalogue_mig_columns()
    keep = ho["workload"] >= 0
    pred = clip_speeds(ho["pred"][keep]).astype(np.float32)
    np.savez_compressed(args.out, workload=ho["workload"][keep].astype(np.int16), pred=pred,
                        names=np.array(names))
    err = np.abs(pred - ho["true"][keep]).mean(0)
    print(f"{args.out}: {int(keep.sum())} held-out predictions of {len(set(ho['workload']))} "
          f"workloads; speed MAE 4g {err[0]:.4f}, 3g {err[1]:.4f}")


if __name__ == "__main__":
    main()
