"""Figures (matplotlib, Agg backend): bars normalised to NoPart, relative-JCT CDF, sweeps."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from miso.sim.engine import SimResult  # noqa: E402
from miso.sim.metrics import relative_jct  # noqa: E402

METRICS = (("avg_jct_s", "average JCT"), ("makespan_s", "makespan"), ("stp", "STP"))


def bars(summary: Mapping[str, Mapping[str, float]], path: Path, base: str = "nopart") -> Path:
    """The paper's Fig. 10: average JCT, makespan and STP of each policy / NoPart's."""
    pols = list(summary)
    ref = summary.get(base) or summary[pols[0]]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, (key, label) in zip(axes, METRICS, strict=True):
        vals = [summary[p][key] / ref[key] for p in pols]
        ax.bar(pols, vals, color=plt.cm.tab10(np.arange(len(pols))))
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_title(f"{label} (normalised to {base if base in summary else pols[0]})")
        ax.tick_params(axis="x", rotation=30)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def rel_jct_cdf(results: Mapping[str, SimResult], path: Path) -> Path:
    """The paper's Fig. 11: CDF of JCT / time alone on a full GPU."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for p, r in results.items():
        x = np.sort(relative_jct(r))
        ax.plot(x, np.arange(1, len(x) + 1) / len(x), label=p)
    ax.set_xscale("log")
    ax.set_xlabel("relative JCT (JCT / run time alone on a full GPU)")
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sweep(data: Mapping[str, Mapping[str, Mapping[str, float]]], path: Path, xlabel: str,
          base: str = "nopart") -> Path:
    """Metrics of each policy normalised to ``base`` at each x (Fig. 19 / Fig. 13 style)."""
    xs = list(data)
    pols = list(next(iter(data.values())))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, (key, label) in zip(axes, METRICS, strict=True):
        for p in pols:
            ys = [data[x][p][key] / data[x][base][key] if base in data[x] else data[x][p][key]
                  for x in xs]
            ax.plot([float(x) for x in xs], ys, marker="o", label=p)
        ax.set_xlabel(xlabel)
        ax.set_title(f"{label} / {base}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def owner_shares(r: SimResult, path: Path) -> Path:
    """Each owner's share of the GPU-equivalents in use over time (stacked; tenancy runs)."""
    owners = sorted({o for _, d in r.owner_usage for o in d} | set(r.owners) - {""})
    ts = np.array([t for t, _ in r.owner_usage]) / 3600.0
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if len(ts):
        tot = np.array([sum(d.values()) for _, d in r.owner_usage])
        tot[tot <= 0] = 1.0
        ys = [np.array([d.get(o, 0.0) for _, d in r.owner_usage]) / tot for o in owners]
        ax.stackplot(ts, ys, labels=owners, step="post")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("share of GPU-equivalents in use")
    ax.set_ylim(0, 1)
    ax.set_title(f"{r.policy}: owners' shares over time")
    if len(owners) <= 12:
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
