"""``miso simulate``: run scheduling policies on a simulated MIG cluster (registered by
:mod:`miso.cli` as ``app.command("simulate")(simulate)``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from miso.cli import checks
from miso.cli.simfairness import add_fairness as _add_fairness
from miso.cli.simfairness import fair_price_option
from miso.cli.simfairness import print_fairness as _print_fairness
from miso.cli.simfairness import print_owners as _print_owners
from miso.cli.simfairness import tenancy_setup as _tenancy
from miso.cli.simservices import run_services as _services
from miso.cli.text import fail, make_console

SWEEP_IAT = (20.0, 30.0, 45.0, 60.0, 90.0, 120.0)
SWEEP_K = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)




def _gpu_mix(gpus: str) -> tuple[int, tuple[tuple[str, int], ...]]:
    """``--gpus``: a count (one model) or ``MODEL:COUNT,...`` -> (total, mix; () for one)."""
    from miso.mig import gpu_model as find_gpu_model

    text = gpus.strip()
    if ":" not in text:
        try:
            n = int(text)
        except ValueError:
            fail(f"--gpus {gpus!r}: expected a number or MODEL:COUNT,... "
                 "(e.g. A100-40GB:8,H100-80GB:8)")
        if n < 1:
            fail(f"--gpus must be >= 1, not {n}")
        return n, ()
    mix: list[tuple[str, int]] = []
    for part in text.split(","):
        name, _, cnt = part.strip().rpartition(":")
        try:
            m = find_gpu_model(name.strip()).name
        except KeyError as e:
            fail(f"--gpus: {e.args[0]}")
        try:
            k = int(cnt)
        except ValueError:
            fail(f"--gpus {part.strip()!r}: the count after ':' is not a number")
        if k < 1:
            fail(f"--gpus {part.strip()!r}: the count must be >= 1")
        if any(x == m for x, _ in mix):
            fail(f"--gpus: {m} given twice")
        mix.append((m, k))
    return sum(k for _, k in mix), tuple(mix)


def _window(window: str | None) -> tuple[float, float] | None:
    """``START:END`` seconds of submit time, 0 <= START < END."""
    if not window:
        return None
    try:
        a, b = (float(x) for x in window.split(":"))
    except ValueError:
        raise checks.InputError(f"--window {window!r}: expected START:END in seconds") from None
    checks.non_negative(a, "--window START")
    checks.number(b, "--window END", low=a, low_open=True)
    return a, b


DEFAULT_MODEL = "A100-40GB"
ALL_POLICIES = "nopart,optsta,mps,oracle,miso,miso+"


def _given(value: str, old_value: str | None, default: str, flag: str, old_flag: str) -> str:
    """``flag``'s value, or its hidden old spelling's when only that one was given."""
    if old_value is None:
        return value
    return checks.required(checks.alias(None if value == default else value, old_value, flag,
                                        old_flag), flag)


def simulate(
    gpu_model: Annotated[str, typer.Option(
        "--gpu-model", help="GPU model (see `miso gpus`).")] = DEFAULT_MODEL,
    gpus: Annotated[str, typer.Option(
        help="Number of GPUs (of --gpu-model), or GPU models with their counts: "
        "A100-40GB:8,H100-80GB:8 (job durations are on a whole GPU of the first).")] = "40",
    jobs: Annotated[int, typer.Option(
        min=1, help="Jobs to simulate (with --trace: the first N).")] = 1000,
    arrival: Annotated[str, typer.Option(
        help="Arrival process: poisson (for others give a --trace).")] = "poisson",
    mean_interarrival: Annotated[float, typer.Option(
        help="Mean Poisson inter-arrival time (s, > 0).")] = 60.0,
    trace: Annotated[str | None, typer.Option(
        help="CSV file (job_id,submit_time_s,duration_s[,workload]) or miso100 / philly.")] = None,
    policy: Annotated[str, typer.Option(
        "--policy", help="Policy to run, or several to compare, comma-separated: nopart, "
        "optsta, mps, oracle, miso, miso+.")] = ALL_POLICIES,
    seed: Annotated[int, typer.Option(help="Seed (>= 0; runs are deterministic per seed).")] = 1,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write the results (JSON) to this file; '-': print them instead of "
        "the tables (as --json elsewhere).")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", "--plot-dir", help="Write figures into this directory.")] = None,
    sweep: Annotated[str | None, typer.Option(
        help="interarrival or jobs-per-gpu: run a sweep instead of one comparison.")] = None,
    predictor: Annotated[str, typer.Option(
        help="Predictor error model: noisy (Gaussian, paper), unet (learned), heldout (real "
        "errors of a predictor that never saw the job's model family; heldout:FAMILY: only "
        "that family is new, the others get the Gaussian error), true.")] = "noisy",
    profiled_at_submit: Annotated[bool, typer.Option(
        "--profiled-at-submit", help="Every job's MPS profile is taken before it reaches the "
        "cluster: miso+ plans every job with its estimate from the start (noisy, heldout, "
        "true).")] = False,
    error_scale: Annotated[float, typer.Option(
        help="heldout predictors: multiply every held-out error by this (>= 0).")] = 1.0,
    restart_s: Annotated[float, typer.Option(
        help="Cost of every restart (s): checkpoint, start, warm-up, restore.")] = 60.0,
    restart_spread: Annotated[float, typer.Option(
        help="Per-job restart costs drawn around --restart-s (lognormal, this log-space "
        "sigma, same mean); policies are told only --restart-s.")] = 0.0,
    duration_dist: Annotated[str, typer.Option(
        help="Poisson job durations: miso (drawn from the MISO trace) or lognormal (the "
        "trace's mean, --duration-sigma).")] = "miso",
    duration_sigma: Annotated[float, typer.Option(
        help="Log-space sigma of --duration-dist lognormal (>= 0).")] = 1.0,
    no_checkpoint_frac: Annotated[float, typer.Option(
        help="Fraction of jobs that cannot checkpoint (lose all progress on restart).")] = 0.0,
    reconfig_s: Annotated[float, typer.Option(help="MIG reconfiguration time (s, >= 0).")] = 4.0,
    window: Annotated[str | None, typer.Option(
        help="Keep trace jobs submitted in [START, END) seconds (START:END).")] = None,
    time_scale: Annotated[float, typer.Option(
        help="Multiply trace submit times (> 0; 0.5 = twice the rate).")] = 1.0,
    duration_scale: Annotated[float, typer.Option(help="Multiply job durations (> 0).")] = 1.0,
    events: Annotated[Path | None, typer.Option(
        "--events", help="Write the decision log (JSONL, one record per decision with its "
        "reason) here; read it with `miso events --file FILE`.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", hidden=True,
                                            help="Old spelling of --gpu-model.")] = None,
    policies: Annotated[str | None, typer.Option("--policies", hidden=True,
                                                 help="Old spelling of --policy.")] = None,
    tenants: Annotated[int | None, typer.Option(
        min=1, help="Owners of the Poisson jobs (u0, u1, ...); a trace's owners come from its "
        "user or vc column.")] = None,
    tenant_skew: Annotated[float | None, typer.Option(
        help="Fraction of the jobs owner u0 submits (the others share the rest equally; "
        "default: all equal).")] = None,
    fair_share: Annotated[bool, typer.Option(
        "--fair-share", help="Order waiting jobs by owners' decayed usage against their "
        "weights (Slurm's F = 2^(-U/S)) instead of FIFO.")] = False,
    half_life: Annotated[float, typer.Option(
        help="Half-life of owners' usage (s) for --fair-share.")] = 7 * 24 * 3600.0,
    priority_frac: Annotated[float, typer.Option(
        help="Fraction of the jobs marked high priority.")] = 0.0,
    preempt: Annotated[bool, typer.Option(
        "--preempt", help="A high-priority job that cannot be placed preempts lower ones "
        "(checkpoint and requeue).")] = False,
    min_run_s: Annotated[float, typer.Option(
        help="With --preempt: a job is never preempted before running this long (s).")] = 600.0,
    reclaim: Annotated[bool, typer.Option(
        "--reclaim/--no-reclaim", help="With --fair-share: owners below their entitlement "
        "get fair slices and room lent to others is reclaimed (--no-reclaim: fair share "
        "orders the queue only).")] = True,
    demand_per_job: Annotated[float | None, typer.Option(
        help="With --fair-share: a fixed cap on fair slices instead of --fairness-price: GPUs "
        "one job counts towards its owner's entitlement, the most of a GPU a fair slice can "
        "be.")] = None,
    fairness_price: Annotated[float | None, typer.Option(
        "--fairness-price", help="With --fair-share: the share of the total average JCT you "
        "accept to pay for fairness (0.05: 5 %); fair slices follow the backlog within it "
        "(src/miso/sched/fairprice.py).  [default: 0.05]")] = None,
    fairness_report: Annotated[bool, typer.Option(
        "--fairness-report", help="Also run each policy with fair share off and each owner "
        "alone on its entitled share, and report the price of fairness, each owner's "
        "sharing incentive and the jobs' finish-time fairness (JSON: policies.P.fairness).")
    ] = False,
    services: Annotated[Path | None, typer.Option(
        help="Inference services (YAML or JSON, see miso.sim.servicefile): simulate them "
        "request by request under miso+ and the static-gpu, static-mig and hpa-gpu "
        "baselines, training on the GPUs they leave; per-service JSON under 'services'.")]
    = None,
) -> None:
    """Simulate MIG scheduling policies and report JCT, makespan, STP and restarts."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from miso.mig import gpu_model as find_gpu_model
    from miso.sched import policy_names
    from miso.sim.run import compare, sweep_interarrival, sweep_jobs_per_gpu
    from miso.sim.traces import DURATION_DISTS, TraceError, load_trace, poisson_jobs
    from miso.sim.world import WorldConfig

    checks.positive(mean_interarrival, "--mean-interarrival")
    checks.non_negative(restart_s, "--restart-s")
    checks.non_negative(reconfig_s, "--reconfig-s")
    checks.non_negative(restart_spread, "--restart-spread")
    checks.non_negative(duration_sigma, "--duration-sigma")
    if duration_dist not in DURATION_DISTS:
        fail(f"--duration-dist must be {' or '.join(DURATION_DISTS)}, not {duration_dist!r}")
    if duration_dist != "miso" and trace is not None:
        fail("--duration-dist applies to Poisson jobs; a --trace has its own durations")
    checks.positive(time_scale, "--time-scale")
    checks.positive(duration_scale, "--duration-scale")
    checks.non_negative(seed, "--seed")
    checks.fraction(no_checkpoint_frac, "--no-checkpoint-frac")
    checks.positive(half_life, "--half-life")
    checks.fraction(priority_frac, "--priority-frac")
    checks.non_negative(min_run_s, "--min-run-s")
    if tenant_skew is not None:
        checks.fraction(tenant_skew, "--tenant-skew")
        if tenants is None:
            fail("--tenant-skew needs --tenants")
    win = _window(window)
    try:
        model = find_gpu_model(_given(gpu_model, gpu, DEFAULT_MODEL, "--gpu-model",
                                      "--gpu")).name
    except KeyError as e:
        fail(str(e.args[0]))
    pol_flag = "--policy" if policies is None else "--policies"  # the spelling given
    pols = checks.names(_given(policy, policies, ALL_POLICIES, "--policy", "--policies"),
                        pol_flag)
    known = policy_names()
    bad = [p for p in pols if p not in known]
    if bad:
        fail(f"{pol_flag}: unknown policy {', '.join(bad)}; known: {', '.join(known)}")
    from miso.sim.heldout import parse_heldout

    try:
        held = parse_heldout(predictor)
    except ValueError as e:
        fail(f"--predictor {e.args[0]}")
    if predictor not in ("noisy", "unet", "true") and held is None:
        fail(f"--predictor must be noisy, unet, heldout[:FAMILY] or true, not {predictor!r}")
    checks.non_negative(error_scale, "--error-scale")
    if profiled_at_submit and predictor == "unet":
        fail("--profiled-at-submit needs --predictor noisy, heldout or true")
    if arrival != "poisson" and trace is None:
        fail(f"--arrival {arrival!r}: only poisson is built in; give a --trace")
    if sweep is not None and sweep not in ("interarrival", "jobs-per-gpu"):
        fail(f"--sweep must be interarrival or jobs-per-gpu, not {sweep!r}")
    if json_out is not None:
        checks.output_file(json_out, "--json")
    if plot is not None:
        checks.output_dir(plot, "--plot")
    if events is not None:
        checks.output_file(events, "--events")
    n_gpus, mix = _gpu_mix(gpus)
    if mix:
        model = mix[0][0]
    cfg = WorldConfig(gpu_model=model, n_gpus=n_gpus, gpu_mix=mix, restart_s=restart_s,
                      reconfig_s=reconfig_s,
                      predictor=predictor, no_checkpoint_frac=no_checkpoint_frac,
                      restart_spread=restart_spread, profiled_at_submit=profiled_at_submit,
                      error_scale=error_scale)
    out: dict[str, object] = {"config": asdict(cfg) | {"seed": seed, "jobs": jobs,
                                                        "trace": trace or "poisson",
                                                        "mean_interarrival_s":
                                                            mean_interarrival,
                                                        "duration_dist": duration_dist,
                                                        "duration_sigma": duration_sigma}}
    cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
            "{task.total}"), TimeElapsedColumn())
    if sweep is not None and events is not None:
        fail("--events logs the decisions of one comparison; it does not apply to --sweep")
    if sweep is not None:
        xs = SWEEP_IAT if sweep == "interarrival" else SWEEP_K
        with Progress(*cols, transient=True) as prog:
            task = prog.add_task(f"sweep {sweep}", total=len(xs))

            def tick(_: str) -> None:
                prog.advance(task)

            if sweep == "interarrival":
                data = sweep_interarrival(xs, pols, jobs, cfg, seed, progress=tick,
                                          duration_scale=duration_scale,
                                          duration_dist=duration_dist,
                                          duration_sigma=duration_sigma)
            else:
                data = sweep_jobs_per_gpu(xs, pols, cfg, seed, progress=tick)
        out["sweep"] = {"kind": sweep, "results": data}
        if not _to_stdout(json_out):
            _print_sweep(data)
        if plot is not None:
            from miso.sim.plots import sweep as sweep_plot

            label = "mean inter-arrival time (s)" if sweep == "interarrival" else "jobs on the GPU"
            sweep_plot(data, plot / f"sweep_{sweep}.png", label)
        _write(json_out, out)
        return
    try:
        if trace is not None:
            tjobs = load_trace(trace, seed=seed, mean_interarrival_s=mean_interarrival,
                               max_jobs=jobs, window_s=win, time_scale=time_scale,
                               duration_scale=duration_scale)
        else:
            tjobs = poisson_jobs(jobs, seed=seed, mean_interarrival_s=mean_interarrival,
                                 duration_scale=duration_scale, duration_dist=duration_dist,
                                 duration_sigma=duration_sigma)
    except TraceError as e:
        fail(str(e))
    out["gang_jobs"] = sum(1 for j in tjobs if j.num_gpus > 1)  # jobs on several GPUs
    price = fair_price_option(fair_share, demand_per_job, fairness_price)
    tjobs, tenancy = _tenancy(tjobs, tenants, tenant_skew, fair_share, half_life,
                              priority_frac, preempt, min_run_s, seed,
                              reclaim=reclaim, demand_per_job=demand_per_job or 0.5,
                              fairness_price=price)
    if fairness_report and not any(j.owner for j in tjobs):
        fail("--fairness-report needs owners: give --tenants (or a trace with a user or vc "
             "column)")
    if tenancy is not None:
        out["config"]["tenancy"] = {  # type: ignore[index]
            "fair_share": fair_share, "half_life_s": half_life, "preempt": preempt,
            "min_run_s": min_run_s, "tenants": tenants, "tenant_skew": tenant_skew,
            "priority_frac": priority_frac, "reclaim": reclaim,
            "demand_per_job": demand_per_job, "fairness_price": price}
    with Progress(*cols, transient=True) as prog:
        tasks = {p: prog.add_task(p, total=len(tjobs)) for p in pols}

        def cb(p: str, n: int) -> None:
            prog.update(tasks[p], completed=n)

        try:
            logs: list = []
            summary, raw = compare(pols, tjobs, cfg, seed, progress=cb,
                                   observer=_event_log(events, logs), tenancy=tenancy)
            for lg in logs:
                lg.close()
        except ValueError as e:
            fail(str(e))
    if fairness_report:
        _add_fairness(summary, raw, pols, tjobs, cfg, seed, tenancy)
    out["policies"] = summary
    if not _to_stdout(json_out):
        _print_table(summary)
        if fairness_report:
            _print_fairness(summary)
    if services is not None:
        out["services"] = _services(services, cfg.gpu_model, cfg.n_gpus, tjobs, cfg, seed, pols[0])
    if plot is not None:
        from miso.sim.plots import bars, rel_jct_cdf

        bars(summary, plot / "bars.png")
        rel_jct_cdf(raw, plot / "relative_jct_cdf.png")
        if tenancy is not None:
            from miso.sim.plots import owner_shares

            for p, r in raw.items():
                owner_shares(r, plot / f"owner_share_{p.replace('+', 'plus')}.png")
    _write(json_out, out)


def _event_log(path: Path | None, logs: list):  # noqa: ANN202 - None or a factory
    """Observer factory writing every policy's decisions to ``path`` (a fresh file); the logs
    it opens go to ``logs`` (close them after the runs)."""
    if path is None:
        return None
    from miso.observe import DecisionLog, Observer, policy_estimates

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    except OSError as e:
        fail(f"--events {path}: {e.strerror or e}")

    def make(name: str, policy: object) -> Observer:
        for lg in logs:  # the previous policy's run is over
            lg.close()
        logs.append(DecisionLog(path, keep=1, extra={"policy": name}, flush=False))
        return Observer(None, logs[-1], estimates=policy_estimates(policy))

    return make


def _to_stdout(path: Path | None) -> bool:
    return path is not None and str(path) == "-"


def _write(path: Path | None, out: dict[str, object]) -> None:
    if _to_stdout(path):
        typer.echo(json.dumps(out, indent=2, sort_keys=False))
        return
    if path is not None:
        checks.write_text(path, json.dumps(out, indent=2, sort_keys=False), "--json")


def _print_table(summary: dict[str, dict[str, float]]) -> None:
    from rich.table import Table

    t = Table("policy", "avg JCT s", "p95 JCT s", "makespan s", "STP", "restarts/job",
              "lost GPU h", "profiling GPU h", "GPU util", "sim s")
    for p, s in summary.items():
        t.add_row(p, f"{s['avg_jct_s']:.0f}", f"{s['p95_jct_s']:.0f}", f"{s['makespan_s']:.0f}",
                  f"{s['stp']:.3f}", f"{s['restarts_per_job']:.2f}",
                  f"{s['lost_gpu_s'] / 3600:.1f}", f"{s['profiling_gpu_s'] / 3600:.1f}",
                  f"{s['gpu_utilisation']:.2f}", f"{s['wall_s']:.2f}")
    make_console().print(t)
    _print_owners(summary)


def _print_sweep(data: dict[str, dict[str, dict[str, float]]]) -> None:
    from rich.table import Table

    t = Table("x", "policy", "avg JCT s", "makespan s", "STP")
    for x, res in data.items():
        for p, s in res.items():
            t.add_row(x, p, f"{s['avg_jct_s']:.0f}", f"{s['makespan_s']:.0f}", f"{s['stp']:.3f}")
    make_console().print(t)
