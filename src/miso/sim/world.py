"""The simulated world's parameters (ground truth lives here, not in policies; MPS speeds:
:mod:`miso.mps_speed`, the one model shared with the emulated workload).

Defaults follow the paper where it gives a value: MPS profiling 3 levels x 10 s, MPS-only
co-location penalty 0.15 per extra job (MISO artifact). A restart costs ``restart_s`` = 60 s by
default (the paper assumes ~30 s; real restarts of large models take minutes), every MPS level
switch included (see :mod:`miso.sim.engine`). MIG reconfiguration time is not given in the
paper; ``reconfig_s = 4`` is our assumption (destroying and creating GPU/compute instances
takes seconds), a parameter.

Predictor error: the default is the injected Gaussian error of the paper's simulator (mean
0.016, std 0.0032, random sign) through :class:`miso.sched.NoisyOracle`: it is what the paper's
simulation used, it is deterministic and cheap at 100,000 jobs. ``predictor="unet"`` runs the
real learned predictor (:mod:`miso.predict`) on the MPS profiles the profiling runs measure
(:func:`miso.mps_speed.measured_profile`) instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from miso.mps_speed import DEFAULT_PENALTY


@dataclass(frozen=True)
class WorldConfig:
    """Physical parameters of a simulated cluster (seconds unless stated)."""

    gpu_model: str = "A100-40GB"
    n_gpus: int = 40
    #: several GPU models: ((model, count), ...) in GPU order (overrides gpu_model; n_gpus is
    #: their sum); durations are on a whole GPU of the first model, other models run a job
    #: :func:`miso.sched.modelspeed.model_factor` times as fast
    gpu_mix: tuple[tuple[str, int], ...] = ()
    restart_s: float = 60.0            # wait of every restart (checkpoint, start, warm-up, restore)
    restart_spread: float = 0.0        # per-job restart costs: lognormal, this log-space sigma,
                                       # mean restart_s (policies are told only the mean)
    no_checkpoint_frac: float = 0.0    # fraction of jobs that cannot checkpoint (lose all progress)
    reconfig_s: float = 4.0            # MIG destroy/create time when instances change
    profile_s_per_level: float = 10.0  # MPS profiling time per level (3 levels)
    mps_penalty: float = DEFAULT_PENALTY  # MPS slowdown per extra co-located job
    error_mean: float = 0.016          # injected predictor error (NoisyOracle)
    error_std: float = 0.0032
    predictor: str = "noisy"           # noisy | unet | heldout | true
    phase_change_prob: float = 0.0     # chance a job changes speed (phase change) mid-run
    speed_report_threshold: float = 0.05  # driver-side threshold for JobSpeedChanged
    observe_speeds: bool = True        # emit SpeedObserved events
    profiled_at_submit: bool = False   # every job's MPS profile is known when it is submitted
                                       # (taken off the cluster): estimates need no profiling
    error_scale: float = 1.0           # heldout predictors: held-out errors times this
    declare_work: bool = True          # a job declares its work at submission; False: known
                                       # from its first progress report once it runs (live)
