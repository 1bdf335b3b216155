"""Write the evaluation sample shipped as ``src/miso/data/predictor/eval_sample.npz``.

usage: PYTHONPATH=src python benchmarks/predictor/make_sample.py [--data NPZ] [--mixes 150]
       [--out src/miso/data/predictor/eval_sample.npz] [--rest /tmp/train_pairs.npz]

One sample (the first) of each of ``--mixes`` mixes drawn at random (seed 0) from the MISO
MPS/MIG pairs (SoCC'22, Baolin Li et al., MIT licence). ``--rest`` writes every sample of the
other mixes: the shipped model is trained on that file, so `miso predictor eval` on the sample
measures mixes the shipped model never saw.
"""

from __future__ import annotations

import argparse

import numpy as np

from miso.predict.data import load_pairs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/miso-a100/mps_mig_pairs.npz")
    ap.add_argument("--mixes", type=int, default=150)
    ap.add_argument("--out", default="src/miso/data/predictor/eval_sample.npz")
    ap.add_argument("--rest", default="/tmp/train_pairs.npz")
    args = ap.parse_args()
    d = load_pairs(args.data)
    mixes = np.unique(d.mix_id)
    pick = np.sort(np.random.default_rng(0).choice(mixes, size=args.mixes, replace=False))
    first = np.unique(d.mix_id, return_index=True)[1]
    idx = np.sort(first[np.isin(d.mix_id[first], pick)])
    np.savez_compressed(args.out, mps=d.mps[idx], mig=d.mig[idx],
                        mix_id=d.mix_id[idx].astype(np.int32))
    rest = np.flatnonzero(~np.isin(d.mix_id, pick))
    np.savez_compressed(args.rest, mps=d.mps[rest], mig=d.mig[rest],
                        mix_id=d.mix_id[rest].astype(np.int32))
    print(f"{args.out}: {len(idx)} mixes; {args.rest}: {len(rest)} samples of "
          f"{len(mixes) - len(pick)} mixes")


if __name__ == "__main__":
    main()
