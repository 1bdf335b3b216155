"""The simulated world's parameters and speed models (ground truth lives here, not in policies).

Defaults follow the paper where it gives a value: MPS profiling 3 levels x 10 s, MPS-only
co-location penalty 0.15 per extra job (MISO artifact). A restart costs ``restart_s`` = 60 s by
default (the paper assumes ~30 s; real restarts of large models take minutes), every MPS level
switch included (see :mod:`miso.sim.engine`). MIG reconfiguration time is not given in the
paper; ``reconfig_s = 4`` is our assumption (destroying and creating GPU/compute instances
takes seconds), a parameter.

Predictor error: the default is the injected Gaussian error of the paper's simulator (mean
0.016, std 0.0032, random sign) through :class:`miso.sched.NoisyOracle`: it is what the paper's
simulation used, it is deterministic and cheap at 100,000 jobs. ``predictor="unet"`` runs the
real learned predictor (:mod:`miso.predict`) on synthesised MPS profiles instead; its error
then also includes the error of the synthetic MPS model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from miso.workloads import catalogue


@dataclass(frozen=True)
class WorldConfig:
    """Physical parameters of a simulated cluster (seconds unless stated)."""

    gpu_model: str = "A100-40GB"
    n_gpus: int = 40
    restart_s: float = 60.0            # wait of every restart (checkpoint, start, warm-up, restore)
    restart_spread: float = 0.0        # per-job restart costs: lognormal, this log-space sigma,
                                       # mean restart_s (policies are told only the mean)
    no_checkpoint_frac: float = 0.0    # fraction of jobs that cannot checkpoint (lose all progress)
    reconfig_s: float = 4.0            # MIG destroy/create time when instances change
    profile_s_per_level: float = 10.0  # MPS profiling time per level (3 levels)
    mps_penalty: float = 0.15          # MPS-only slowdown per extra co-located job
    error_mean: float = 0.016          # injected predictor error (NoisyOracle)
    error_std: float = 0.0032
    predictor: str = "noisy"           # noisy | unet | heldout | true
    phase_change_prob: float = 0.0     # chance a job changes speed (phase change) mid-run
    speed_report_threshold: float = 0.05  # driver-side threshold for JobSpeedChanged
    observe_speeds: bool = True        # emit SpeedObserved events
    declare_work: bool = True          # a job declares its work at submission; False: known
                                       # from its first progress report once it runs (live)


@cache
def sm_fraction_speed(workload: str, frac: float) -> float:
    """Speed (vs the full GPU) with a fraction ``frac`` of the SMs, interpolated in the A100
    slice table (7 slices = all SMs)."""
    return max(1e-3, min(1.0, catalogue()[workload].speed_at(7.0 * frac)))


def mps_only_speed(workload: str, share_pct: int, n_jobs: int, penalty: float) -> float:
    """MPS-only baseline: speed with ``share_pct`` % of the SMs, slowed by ``1 + penalty*(n-1)``
    for co-location (the MISO artifact's model)."""
    return sm_fraction_speed(workload, share_pct / 100.0) / (1.0 + penalty * (n_jobs - 1))


def mps_profile_speeds(workloads: list[str], levels: tuple[int, ...], penalty: float
                       ) -> list[tuple[float, ...]]:
    """Coarse model of speeds during MPS profiling (progress only; the default error model does
    not read it): at level L with n jobs each job gets ``min(L/100, 1.5/n)`` of the SMs, slowed
    by the co-location penalty."""
    n = len(workloads)
    out = []
    for w in workloads:
        row = []
        for lv in levels:
            frac = min(lv / 100.0, 1.5 / n) if n > 1 else lv / 100.0
            row.append(sm_fraction_speed(w, frac) / (1.0 + penalty * (n - 1)))
        out.append(tuple(row))
    return out
