"""`miso predictor ...`: train and evaluate the MPS-to-MIG predictor."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from miso.cli import checks
from miso.cli.group import QuickHelpGroup
from miso.cli.text import fail

app = typer.Typer(
    help="MPS-to-MIG performance predictor: train it (per-job model, or the U-Net ensemble), "
    "evaluate it on a file.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=QuickHelpGroup,
)

#: Training is the only command that needs PyTorch; the base install has none.
TORCH_MISSING = ('training needs PyTorch, which the base install leaves out: pip install -e '
                 '".[train]" (pip install "miso-gpu[train]"; on a machine without a GPU install '
                 "PyTorch's CPU build first)")

#: evaluation sample shipped with miso (mixes the shipped model was not trained on)
SAMPLE_FILE = "eval_sample.npz"
SAMPLE_CREDIT = ("a sample of the MPS/MIG pairs released with the MISO paper, SoCC'22, "
                 "Baolin Li et al., MIT licence; the full mps_mig_pairs.npz is in the authors' "
                 "artifact")


@app.command()
def train(
    data: Path = typer.Option(..., "--data", help="npz with mps, mig (N,3,7) and mix_id (N,)"),
    out: Path = typer.Option(
        ..., "--out", help="directory for the weights (perjob.npz or unet_ensemble.npz) and "
        "meta.json"),
    seed: int = typer.Option(0, "--seed", help="seed: same seed, same weights"),
    epochs: int | None = typer.Option(None, "--epochs", help="epochs per ensemble member"),
    members: int | None = typer.Option(None, "--members", help="ensemble size"),
    width: int | None = typer.Option(
        None, "--width", help="U-Net width (channels, level 1); per-job model: hidden units"),
    val_frac: float = typer.Option(
        0.0, "--val-frac", help="hold out this fraction of mixes (by mix_id) and report MAE"
    ),
    kind: str = typer.Option(
        "perjob", "--kind", help="perjob (default, numpy; intervals calibrated on held-out "
        "model families) or unet (the MISO U-Net ensemble; needs torch)"),
) -> None:
    """Train on all mixes of FILE (or all but a grouped validation split)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from miso.predict.data import DataError, grouped_split, load_pairs
    from miso.predict.predictor import Predictor, save_ensemble

    for flag, value in (("--epochs", epochs), ("--members", members), ("--width", width)):
        if value is not None:
            checks.number(value, flag, low=1)
    if not 0.0 <= val_frac < 1.0:
        fail(f"--val-frac {val_frac}: must be in [0, 1)")
    if kind not in ("perjob", "unet"):
        fail(f"--kind {kind}: must be perjob or unet")
    checks.output_dir(out, "--out")
    try:
        d = load_pairs(data)
    except DataError as exc:
        fail(str(exc))
    if kind == "perjob":
        _train_perjob(d, data, out, seed, epochs, members, width, val_frac)
        return
    try:  # torch (the optional extra [train]): after the checks
        from miso.predict.train import TrainConfig, train_ensemble
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        fail(TORCH_MISSING)

    cfg = TrainConfig(seed=seed)
    if epochs is not None:
        cfg.epochs = epochs
    if members is not None:
        cfg.members = members
    if width is not None:
        cfg.width = width
    train_idx = None
    val_idx = None
    if val_frac > 0:
        train_idx, val_idx = grouped_split(d.mix_id, val_frac, seed)
    dtr = d.subset(train_idx) if train_idx is not None else d
    t0 = time.perf_counter()
    c0 = time.process_time()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} epochs  loss {task.fields[loss]:.4f}"),
        TimeElapsedColumn(),
    ) as prog:
        task = prog.add_task(f"{cfg.members} member(s)", total=cfg.epochs, loss=0.0)

        def on_epoch(_e: int, loss: float) -> None:
            prog.update(task, advance=1, loss=loss)

        models = train_ensemble(dtr, cfg, seed, on_epoch)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    meta = {
        "config": cfg.as_dict(),
        "train_seconds": round(elapsed, 1),
        "train_cpu_seconds": round(cpu, 1),
        "train_samples": len(dtr),
        "data": str(data.name),
    }
    save_ensemble(models, out, meta)
    if val_idx is not None:
        p = Predictor.load(out)
        dv = d.subset(val_idx)
        mae = float(abs(p.predict_mig_normalised(dv.mps) - dv.mig).mean())
        meta["val_mae"] = round(mae, 5)
        save_ensemble(models, out, meta)
        typer.echo(f"validation MAE ({len(val_idx)} samples, grouped by mix): {mae:.4f}")
    typer.echo(
        f"trained {cfg.members} member(s) in {elapsed:.1f} s (CPU {cpu:.1f} s) -> {out}"
    )


def _train_perjob(d, data: Path, out: Path, seed: int, epochs: int | None,  # noqa: ANN001
                  members: int | None, width: int | None, val_frac: float) -> None:
    """The per-job model: held-out-family calibration, then the model on all (training) mixes."""
    from miso.predict.data import grouped_split
    from miso.predict.evaluation import evaluate
    from miso.predict.heldout import train_calibrated
    from miso.predict.perjob import PerJobConfig
    from miso.predict.predictor import Predictor, save_perjob

    cfg = PerJobConfig(seed=seed)
    if epochs is not None:
        cfg.epochs = epochs
    if members is not None:
        cfg.members = members
    if width is not None:
        cfg.hidden = width
    val_idx = None
    dtr = d
    if val_frac > 0:
        train_idx, val_idx = grouped_split(d.mix_id, val_frac, seed)
        dtr = d.subset(train_idx)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        model, extra = train_calibrated(dtr, cfg)
    except ValueError as exc:
        fail(f"{data}: {exc}")
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    meta = {"config": cfg.as_dict(), "train_seconds": round(elapsed, 1),
            "train_cpu_seconds": round(cpu, 1), "train_mixes": len(set(dtr.mix_id.tolist())),
            "data": str(data.name), **extra}
    save_perjob(model, out, meta)
    if val_idx is not None:
        res = evaluate(Predictor.load(out), d.subset(val_idx))
        meta["validation"] = res
        save_perjob(model, out, meta)
        typer.echo(f"validation ({len(val_idx)} samples, grouped by mix): {json.dumps(res)}")
    ho = extra["heldout"]
    typer.echo(f"held-out model families ({ho['folds']} folds): speed MAE 4g "
               f"{ho['speed_mae']['4g']:.4f}, 3g {ho['speed_mae']['3g']:.4f}; 95 % interval "
               f"half-widths 4g {extra['calibration']['half']['4']:.3f}, 3g "
               f"{extra['calibration']['half']['3']:.3f}")
    typer.echo(f"trained {cfg.members} member(s) in {elapsed:.1f} s (CPU {cpu:.1f} s) -> {out}")


@app.command("eval")
def eval_(
    data: Path | None = typer.Option(
        None, "--data", help="npz with arrays mps and mig of shape (N,3,7); default: the shipped "
        "evaluation sample (mixes the shipped model never saw)"),
    model: Path | None = typer.Option(None, "--model", help="trained directory; default shipped"),
    as_json: bool = typer.Option(False, "--json", help="print only the JSON result"),
) -> None:
    """Errors of the predictor on a file: mae (the file's normalised units, as fed), mae_live
    (padding as the live system pads), speed_mae (real jobs' speeds vs the full GPU, per slice)
    and coverage_95 (real jobs' true speeds inside the 95 % interval)."""
    from importlib import resources

    from miso.predict.data import DataError, load_pairs
    from miso.predict.evaluation import evaluate
    from miso.predict.predictor import Predictor

    try:
        if data is None:
            ref = resources.files("miso.data").joinpath("predictor", SAMPLE_FILE)
            with resources.as_file(ref) as f:
                d = load_pairs(f)
        else:
            d = load_pairs(data)
        pred = Predictor.load(model)
        res = evaluate(pred, d)
    except DataError as exc:
        fail(str(exc))
    typer.echo(json.dumps(res))
    if as_json:
        return
    sp = res["speed_mae"]
    typer.echo(f"{res['real_jobs']} real jobs in {res['samples']} samples"
               f"{'' if data is not None else ' (shipped sample, ' + SAMPLE_CREDIT + ')'}")
    typer.echo(f"MAE (file units) {res['mae']:.4f}, with live padding {res['mae_live']:.4f}; "
               f"speed MAE 4g {sp['4g']:.4f}, 3g {sp['3g']:.4f}; 95 % interval coverage "
               f"{res['coverage_95']:.3f}")
