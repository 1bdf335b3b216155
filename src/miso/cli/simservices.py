"""``miso simulate --services FILE``: the inference services beside the training trace
(:mod:`miso.sim.cotrain`), run and printed per placement strategy. Used by
:mod:`miso.cli.simulate`."""

from __future__ import annotations

from pathlib import Path

from miso.cli.text import fail


def run_services(path: Path, model: str, gpus: int, tjobs: list, cfg: object, seed: int,
              policy: str) -> dict:
    from miso.sim.cotrain import services_report
    from miso.sim.servicefile import load_services

    try:
        svcs, window = load_services(path)
    except (OSError, ValueError, TypeError) as e:
        fail(f"--services: {e}")
    rep = services_report(svcs, model, gpus, tjobs, cfg, seed, window, policy)
    for strat, r in rep.items():
        jct = r["training_avg_jct_s"]
        print(f"services {strat:11s} attainment_min {r['attainment_min']:.4f}  dropped "
              f"{r['dropped']}  slice_hours {r['slice_hours']:.3f}  training_avg_jct_s "
              f"{'never (no GPU left)' if jct is None else f'{jct:.0f}'}")
    return rep
