"""`miso predictor ...`: train and evaluate the MPS-to-MIG predictor."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from miso.cli import checks
from miso.cli.text import fail

app = typer.Typer(
    help="MPS-to-MIG performance predictor: train the U-Net ensemble, evaluate it on a file.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

#: Training is the only command that needs PyTorch; the base install has none.
TORCH_MISSING = ('training needs PyTorch, which the base install leaves out: pip install -e '
                 '".[train]" (pip install "miso-gpu[train]"; on a machine without a GPU install '
                 "PyTorch's CPU build first)")


@app.command()
def train(
    data: Path = typer.Option(..., "--data", help="npz with mps, mig (N,3,7) and mix_id (N,)"),
    out: Path = typer.Option(..., "--out", help="directory for unet_ensemble.npz + meta.json"),
    seed: int = typer.Option(0, "--seed", help="seed: same seed, same weights"),
    epochs: int | None = typer.Option(None, "--epochs", help="epochs per ensemble member"),
    members: int | None = typer.Option(None, "--members", help="ensemble size"),
    width: int | None = typer.Option(None, "--width", help="U-Net width (channels, level 1)"),
    val_frac: float = typer.Option(
        0.0, "--val-frac", help="hold out this fraction of mixes (by mix_id) and report MAE"
    ),
) -> None:
    """Train the ensemble on all mixes of FILE (or all but a grouped validation split)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from miso.predict.data import DataError, grouped_split, load_pairs
    from miso.predict.predictor import Predictor, save_ensemble

    for flag, value in (("--epochs", epochs), ("--members", members), ("--width", width)):
        if value is not None:
            checks.number(value, flag, low=1)
    if not 0.0 <= val_frac < 1.0:
        fail(f"--val-frac {val_frac}: must be in [0, 1)")
    checks.output_dir(out, "--out")
    try:
        d = load_pairs(data)
    except DataError as exc:
        fail(str(exc))
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


@app.command("eval")
def eval_(
    data: Path = typer.Option(..., "--data", help="npz with arrays mps and mig of shape (N,3,7)"),
    model: Path | None = typer.Option(None, "--model", help="trained directory; default shipped"),
    as_json: bool = typer.Option(False, "--json", help="print only the JSON result"),
) -> None:
    """Mean absolute error over all outputs, in the file's own (normalised) units."""
    from miso.predict.data import DataError, load_pairs
    from miso.predict.predictor import Predictor

    try:
        d = load_pairs(data)
        pred = Predictor.load(model)
        p = pred.predict_mig_normalised(d.mps)
    except DataError as exc:
        fail(str(exc))
    err = abs(p - d.mig)
    res = {"mae": round(float(err.mean()), 6), "samples": len(d)}
    if as_json:
        typer.echo(json.dumps(res))
        return
    rows = err.mean(axis=(0, 2))
    typer.echo(json.dumps(res))
    typer.echo(
        "MAE per MIG row: 7g {:.4f}  4g {:.4f}  3g {:.4f}".format(*(float(r) for r in rows))
    )
