"""Run policies on a trace: policy construction (estimators, OptSta's offline search),
comparisons and sweeps. Used by the CLI and the benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from miso.mig import enumerate_layouts, geometry, multiset
from miso.sched import Policy, make_policy
from miso.sched.estimators import make_estimator as estimator_named
from miso.sched.policies import build_policy as build_sched_policy
from miso.sched.policies import policy_options
from miso.sched.speeds import workload_speeds
from miso.sched.tenancyconfig import TenancyConfig
from miso.sim.engine import SimResult, Simulator
from miso.sim.metrics import summarize
from miso.sim.traces import TraceJob
from miso.workloads import catalogue

ALL_POLICIES = ("nopart", "optsta", "mps", "oracle", "miso", "miso+")


class ProfiledAtSubmit:
    """An estimator whose jobs were profiled before they reached the cluster
    (``WorldConfig.profiled_at_submit``): the same estimates, known from submission, so a
    policy plans every job with them rather than with a prior or a profiling run. Only for
    estimators that do not read the profile itself (true, noisy, heldout)."""

    needs_profile = False

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.uncertainty = inner.uncertainty

    def __getattr__(self, name: str) -> Any:  # interval, calibration, ...
        if name == "inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def estimate(self, geom: Any, jobs: Any, profile: Any = None) -> dict:
        return self.inner.estimate(geom, jobs, profile)


def make_estimator(cfg: Any, seed: int) -> Any:
    """The speed estimator of MISO-like policies for a world config
    (:func:`miso.sched.estimators.make_estimator` of ``cfg.predictor``; ``heldout`` and
    ``heldout:FAMILY``, the simulator's family-held-out predictions, are built here)."""
    from miso.sim.heldout import HeldOutPredictions, parse_heldout

    fams = parse_heldout(cfg.predictor)
    if fams is not None:
        est: Any = HeldOutPredictions(seed, fams, cfg.error_scale)
    else:
        est = estimator_named(cfg.predictor, seed=seed, error_mean=cfg.error_mean,
                              error_std=cfg.error_std)
    if cfg.profiled_at_submit and est.needs_profile:
        if cfg.predictor in ("unet", "auto", "predictor", "heuristic"):
            raise ValueError(f"profiled_at_submit needs an estimator that does not read the "
                             f"profile (true, noisy, heldout), not {cfg.predictor!r}")
        est = ProfiledAtSubmit(est)
    return est


def optsta_candidates(gpu_model: str) -> list[tuple]:
    """One maximal layout per distinct profile multiset (placement does not matter for a
    static partition), excluding the single full-GPU layout (that is NoPart)."""
    geom = geometry(gpu_model)
    seen: dict[tuple[str, ...], tuple] = {}
    for lay in enumerate_layouts(geom, maximal=True):
        ms = multiset(geom, lay)
        if len(lay) > 1 and ms not in seen:
            seen[ms] = lay
    return list(seen.values())


def optsta_search(jobs: Sequence[TraceJob], cfg: Any, seed: int,
                  sample: int = 300) -> tuple | dict[str, tuple]:
    """OptSta's exhaustive offline search: simulate the first ``sample`` jobs of the trace on
    every candidate static layout (GPU count scaled to keep the load) and keep the layout with
    the lowest average JCT. OptSta is allowed this offline knowledge (paper: "exhaustive offline
    search"). On several GPU models (``cfg.gpu_mix``): model -> its best layout, each searched
    so on a cluster of that model alone (the sample's jobs that may run there, durations divided
    by the model's factor, :func:`miso.sched.modelspeed.model_factor`)."""
    sub = list(jobs[:sample])
    n_gpus = max(1, round(cfg.n_gpus * len(sub) / max(1, len(jobs)))) if len(jobs) > sample \
        else cfg.n_gpus
    n_gpus = max([n_gpus, *(j.num_gpus for j in sub)])  # the sample's largest gang fits
    models = [m for m, _ in cfg.gpu_mix]
    if len(set(models)) > 1:
        from miso.sched.modelspeed import model_factor

        return {m: _optsta_best(
            [replace(j, duration_s=j.duration_s / model_factor(j.workload, m, models[0]))
             for j in sub if j.gpu_model in (None, m)],
            replace(cfg, gpu_model=m, gpu_mix=(), n_gpus=n_gpus), seed)
            for m in dict.fromkeys(models)}
    return _optsta_best(sub, replace(cfg, n_gpus=n_gpus), seed)


def _optsta_best(sub: list[TraceJob], scfg: Any, seed: int) -> tuple:
    """The candidate layout of ``scfg.gpu_model`` with the lowest average JCT on ``sub``."""
    best = None
    geom = geometry(scfg.gpu_model)
    need = {j.workload for j in sub}
    for lay in optsta_candidates(scfg.gpu_model):
        profs = {pl.profile for pl in lay}
        if any(not profs & set(workload_speeds(geom, catalogue()[w])) for w in need):
            continue  # some job of the trace fits no instance of this layout
        pol = make_policy("optsta", layout=lay)
        try:
            r = Simulator(pol, sub, scfg, seed=seed).run()
        except Exception:  # noqa: BLE001  (a layout whose slices hold no job of the trace)
            continue
        jct = float(r.jct.mean())
        if best is None or jct < best[0]:
            best = (jct, lay)
    if best is None:
        raise RuntimeError("no static layout can run this trace")
    return best[1]


def build_policy(name: str, jobs: Sequence[TraceJob], cfg: Any, seed: int,
                 **kw: Any) -> Policy:
    """A ready policy for a run: the policy table's one factory
    (:func:`miso.sched.policies.build_policy`, which the live controller uses too) with the
    world's knobs as defaults for a policy that takes them (its estimator, profiling time per
    MPS level, restart prior); OptSta's layout searched offline."""
    known = policy_options(name)
    defaults: dict[str, Any] = {"profile_seconds_per_level": cfg.profile_s_per_level,
                                "restart_s": cfg.restart_s}
    if "estimator" in known and "estimator" not in kw:
        defaults["estimator"] = make_estimator(cfg, seed)
    if "layout" in known and "layout" not in kw:  # OptSta (and a profile built on it)
        kw["layout"] = optsta_search(jobs, cfg, seed)
    return build_sched_policy(name, defaults, **kw)


def run_policy(name: str, jobs: Sequence[TraceJob], cfg: Any, seed: int = 1,
               progress: Callable[[int], None] | None = None, record: bool = False,
               observer: Callable[[Policy], Any] | None = None,
               tenancy: TenancyConfig | None = None, **kw: Any) -> SimResult:
    """Build and simulate one policy (``observer(policy)`` builds an observer for the run;
    ``tenancy`` turns on owners' usage, fair share, quotas, preemption)."""
    pol = build_policy(name, jobs, cfg, seed, **kw)
    obs = observer(pol) if observer is not None else None
    return Simulator(pol, jobs, cfg, seed=seed, record=record, observer=obs,
                     tenancy=tenancy).run(progress)


def compare(policies: Sequence[str], jobs: Sequence[TraceJob], cfg: Any, seed: int = 1,
            progress: Callable[[str, int], None] | None = None,
            observer: Callable[[str, Policy], Any] | None = None,
            tenancy: TenancyConfig | None = None,
            ) -> tuple[dict[str, dict[str, float]], dict[str, SimResult]]:
    """Run several policies on the same trace; returns (summaries, raw results).
    ``observer(name, policy)`` builds an observer per run (e.g. for the decision log)."""
    out: dict[str, dict[str, float]] = {}
    raw: dict[str, SimResult] = {}
    for p in policies:
        cb = (lambda n, p=p: progress(p, n)) if progress else None
        mk = (lambda pol, p=p: observer(p, pol)) if observer else None
        r = run_policy(p, jobs, cfg, seed, progress=cb, observer=mk, tenancy=tenancy)
        out[p] = summarize(r)
        raw[p] = r
    return out, raw


def fixed_jobs(k: int, *, seed: int = 1, duration_s: float = 600.0) -> list[TraceJob]:
    """``k`` jobs submitted at time 0, each ``duration_s`` long on a full GPU, workloads drawn
    from the MISO trace (the paper's single-GPU experiment, Fig. 13)."""
    import numpy as np

    from miso.sim.traces import load_trace

    base = load_trace("miso100", seed=seed)
    rng = np.random.default_rng([seed, 13])
    pick = rng.integers(len(base), size=k)
    return [TraceJob(str(i), 0.0, duration_s, base[int(p)].workload) for i, p in enumerate(pick)]


def sweep_interarrival(values: Sequence[float], policies: Sequence[str], n_jobs: int, cfg: Any,
                       seed: int = 1, progress: Callable[[str], None] | None = None,
                       **trace_options: Any) -> dict[str, dict[str, dict[str, float]]]:
    """{str(mean inter-arrival): {policy: summary}} over Poisson traces (``trace_options``
    go to :func:`~miso.sim.traces.poisson_jobs`: durations)."""
    from miso.sim.traces import poisson_jobs

    out: dict[str, dict[str, dict[str, float]]] = {}
    for v in values:
        jobs = poisson_jobs(n_jobs, seed=seed, mean_interarrival_s=v, **trace_options)
        out[f"{v:g}"], _ = compare(policies, jobs, cfg, seed)
        if progress:
            progress(f"inter-arrival {v:g} s")
    return out


def sweep_jobs_per_gpu(ks: Sequence[int], policies: Sequence[str], cfg: Any, seed: int = 1,
                       progress: Callable[[str], None] | None = None
                       ) -> dict[str, dict[str, dict[str, float]]]:
    """{str(k): {policy: summary}}: one GPU, k jobs of 10 minutes submitted together."""
    one = replace(cfg, n_gpus=1)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for k in ks:
        out[str(k)], _ = compare(policies, fixed_jobs(k, seed=seed), one, seed)
        if progress:
            progress(f"{k} jobs per GPU")
    return out
