"""Job traces: seeded Poisson generation, the shipped MISO and Philly traces, and any CSV.

A trace is a list of :class:`TraceJob` (submit time, run time alone on a full GPU, workload,
owner, priority). CSV columns: ``job_id,submit_time_s,duration_s`` (extra columns allowed). The
owner (tenant) comes from a ``user`` column, else from ``vc`` (the Philly trace's virtual
cluster); an optional ``priority`` column holds high/normal/low or an integer. A ``workload`` column
(or the MISO trace's ``model`` column) names a catalogue workload; a job without one gets a
workload drawn uniformly from the catalogue with the seed. A ``num_gpus`` column keeps each
job's GPU count (a job on several whole GPUs, a gang: :mod:`miso.sched.gangs`;
``single_gpu_only`` drops those rows, an explicit filter only); a ``gpu_model`` (or
``gpu_type``) column pins a job to a GPU model where present. If *every* ``submit_time_s`` is
empty (the MISO trace has none), arrivals are drawn as a Poisson process with the given mean
inter-arrival time, as MISO does.

Poisson durations (``poisson_jobs``): drawn with replacement from the MISO 100-job trace. The
default column is ``exp_100_value`` (mean 3,122 s); its ``duration_s`` column (mean 770 s) puts
about 13 of 40 GPUs to work at a 60 s mean inter-arrival time, a load where no sharing policy
can improve JCT over NoPart (measured in benchmarks/README.md), while the paper reports +70 %.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import zlib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np

from miso.sched.tenancyconfig import HIGH, parse_priority
from miso.workloads import catalogue

#: Duration distributions of :func:`poisson_jobs` (``miso simulate --duration-dist``).
DURATION_DISTS = ("miso", "lognormal")

SHIPPED = {"miso100": "miso_trace_100.csv", "philly": "philly_2017_pass.csv.gz"}


class TraceError(ValueError):
    """A malformed trace; the message names the file, the row and the problem (one line)."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace; ``duration_s`` is its run time alone on a full GPU; ``owner`` the
    tenant it is charged to, ``priority`` its class (:mod:`miso.sched.tenancy`)."""

    id: str
    submit_s: float
    duration_s: float
    workload: str
    owner: str = ""
    priority: int = 0
    num_gpus: int = 1
    gpu_model: str | None = None
    #: the MIG profile the job is pinned to (``JobSpec.profile``; None: the policy chooses)
    profile: str | None = None
    #: jobs (ids) that must end before this one is eligible (``JobSpec.after``)
    after: tuple[str, ...] = ()


#: Largest trace read (after decompression): the Philly trace is ~4 MiB; a bigger input is
#: refused rather than read until memory runs out.
MAX_TRACE_BYTES = 512 * 1024 * 1024


def _read_text(source: str | Path) -> tuple[str, str]:
    name = str(source)
    if name in SHIPPED:
        data = resources.files("miso.data").joinpath(SHIPPED[name]).read_bytes()
    else:
        p = Path(source)
        if not p.is_file():
            raise TraceError(f"{name}: no such trace file (or use one of: {', '.join(SHIPPED)})")
        try:
            with open(p, "rb") as f:
                data = f.read(MAX_TRACE_BYTES + 1)
        except OSError as exc:
            raise TraceError(f"{name}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = gz.read(MAX_TRACE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{name}: not a valid gzip file ({exc})") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"{name}: larger than {MAX_TRACE_BYTES >> 20} MiB")
    try:
        return name, data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceError(f"{name}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save "
                         "the trace as UTF-8") from None


def _num(val: str | None, col: str, where: str) -> float:
    if val is None:
        raise TraceError(f"{where}: column {col} is missing")
    try:
        x = float(val)
    except ValueError:
        raise TraceError(f"{where}: {col} {val!r} is not a number") from None
    if not math.isfinite(x):
        raise TraceError(f"{where}: {col} {val!r} is not finite")
    return x


def load_trace(
    source: str | Path,
    *,
    seed: int = 1,
    mean_interarrival_s: float = 60.0,
    max_jobs: int | None = None,
    window_s: tuple[float, float] | None = None,
    time_scale: float = 1.0,
    duration_scale: float = 1.0,
    single_gpu_only: bool = False,
    duration_column: str = "duration_s",
) -> list[TraceJob]:
    """Parse and validate a trace (path or ``miso100``/``philly``), sorted by submit time.

    ``window_s=(start, end)`` keeps jobs submitted in [start, end) and shifts them to start at
    0; ``time_scale`` multiplies submit times (0.5 = twice the arrival rate); ``duration_scale``
    multiplies run times; ``max_jobs`` keeps the first jobs after windowing.
    """
    name, text = _read_text(source)
    reader = csv.DictReader(io.StringIO(text))
    try:
        cols = list(reader.fieldnames or [])
        records = list(reader)
    except csv.Error as exc:
        raise TraceError(f"{name}: not CSV ({exc})") from None
    for col in ("job_id", "submit_time_s", duration_column):
        if col not in cols:
            raise TraceError(f"{name}: missing column {col!r} (have: {', '.join(cols)})")
    wl_col = "workload" if "workload" in cols else ("model" if "model" in cols else None)
    own_col = "user" if "user" in cols else ("vc" if "vc" in cols else None)
    pri_col = "priority" if "priority" in cols else None
    n_col = "num_gpus" if "num_gpus" in cols else None
    m_col = "gpu_model" if "gpu_model" in cols else ("gpu_type" if "gpu_type" in cols else None)
    cat = catalogue()
    names = sorted(cat)
    rng = np.random.default_rng(seed)
    rows: list[tuple[str, float | None, float, str | None]] = []
    extra: dict[str, tuple[str, int]] = {}
    shape: dict[str, tuple[int, str | None]] = {}
    empty_submit = 0
    for i, row in enumerate(records, start=2):
        where = f"{name}:{i}"
        jid = (row.get("job_id") or "").strip()
        if not jid:
            raise TraceError(f"{where}: job_id is empty")
        sub_raw = (row.get("submit_time_s") or "").strip()
        sub = None
        if sub_raw == "":
            empty_submit += 1
        else:
            sub = _num(sub_raw, "submit_time_s", where)
            if sub < 0:
                raise TraceError(f"{where}: submit_time_s {sub_raw} is negative")
        dur = _num((row.get(duration_column) or "").strip(), duration_column, where)
        if dur <= 0:
            raise TraceError(f"{where}: {duration_column} {dur:g} is not positive")
        wl = (row.get(wl_col) or "").strip() if wl_col else ""
        if wl and wl not in cat:
            raise TraceError(f"{where}: unknown workload {wl!r}")
        n_raw = (row.get(n_col) or "").strip() if n_col else ""
        n = 1
        if n_raw:
            x = _num(n_raw, "num_gpus", where)
            if x < 1 or x != int(x) or x > 100_000:
                raise TraceError(f"{where}: num_gpus {n_raw!r} is not a whole number >= 1")
            n = int(x)
        if single_gpu_only and n != 1:
            continue
        rows.append((jid, sub, dur, wl or None))
        model = (row.get(m_col) or "").strip() if m_col else ""
        if n != 1 or model:
            shape[jid] = (n, model or None)
        if own_col or pri_col:
            owner = (row.get(own_col) or "").strip() if own_col else ""
            pri_raw = (row.get(pri_col) or "").strip() if pri_col else ""
            try:
                pri = parse_priority(pri_raw) if pri_raw else 0
            except ValueError as exc:
                raise TraceError(f"{where}: {exc}") from None
            extra[jid] = (owner, pri)
    if not rows:
        raise TraceError(f"{name}: no jobs")
    if 0 < empty_submit < len(rows):
        raise TraceError(f"{name}: submit_time_s is empty in {empty_submit} of {len(rows)} rows "
                         f"(all empty = Poisson arrivals)")
    if empty_submit:
        gaps = rng.exponential(mean_interarrival_s, len(rows))
        gaps[0] = 0.0
        subs = np.cumsum(gaps)
        rows = [(j, float(s), d, w) for (j, _, d, w), s in zip(rows, subs, strict=True)]
    rows.sort(key=lambda r: (r[1], r[0]))
    if window_s is not None:
        a, b = window_s
        rows = [r for r in rows if a <= r[1] < b]  # type: ignore[operator]
        if not rows:
            raise TraceError(f"{name}: no job submitted in the window [{a}, {b})")
    t0 = rows[0][1] or 0.0
    out = []
    for jid, sub, dur, wl in rows[: max_jobs or None]:
        w = wl if wl is not None else names[int(rng.integers(len(names)))]
        owner, pri = extra.get(jid, ("", 0))
        n, model = shape.get(jid, (1, None))
        out.append(TraceJob(jid, (sub - t0) * time_scale, dur * duration_scale, w,  # type: ignore[operator]
                            owner, pri, n, model))
    return out


def assign_tenants(jobs: list[TraceJob], n: int, skew: float, *, seed: int = 1
                   ) -> list[TraceJob]:
    """Owners ``u0 .. u{n-1}`` drawn per job (seeded): ``u0`` submits a fraction ``skew`` of
    the jobs, the others share the rest equally (``skew = 1/n``: all equal)."""
    if n < 1:
        raise ValueError(f"tenants must be >= 1, not {n}")
    if not 0.0 <= skew <= 1.0:
        raise ValueError(f"tenant skew must be in [0, 1], not {skew}")
    if n == 1:
        return [replace(j, owner="u0") for j in jobs]
    rng = np.random.default_rng([seed, 16])
    p = np.array([skew] + [(1.0 - skew) / (n - 1)] * (n - 1))
    who = rng.choice(n, size=len(jobs), p=p / p.sum())
    return [replace(j, owner=f"u{int(k)}") for j, k in zip(jobs, who, strict=True)]


def mark_priority(jobs: list[TraceJob], frac: float, *, seed: int = 1) -> list[TraceJob]:
    """A seeded fraction ``frac`` of the jobs marked ``high`` priority."""
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"priority fraction must be in [0, 1], not {frac}")
    rng = np.random.default_rng([seed, 17])
    hi = rng.random(len(jobs)) < frac
    return [replace(j, priority=HIGH) if h else j for j, h in zip(jobs, hi, strict=True)]


def poisson_jobs(
    n: int,
    *,
    seed: int = 1,
    mean_interarrival_s: float = 60.0,
    duration_column: str = "exp_100_value",
    duration_scale: float = 1.0,
    duration_dist: str = "miso",
    duration_sigma: float = 1.0,
) -> list[TraceJob]:
    """``n`` jobs with Poisson arrivals; (duration, workload) pairs drawn from the MISO trace.

    ``duration_dist="lognormal"`` keeps the drawn workloads and arrivals but draws each
    duration from a lognormal with the MISO column's mean and log-space standard deviation
    ``duration_sigma`` (heavier tails than the trace for sigma >= 1)."""
    if duration_dist not in DURATION_DISTS:
        raise ValueError(f"duration_dist must be one of {', '.join(DURATION_DISTS)}, "
                         f"not {duration_dist!r}")
    if not (math.isfinite(duration_sigma) and duration_sigma >= 0):
        raise ValueError(f"duration_sigma must be >= 0, not {duration_sigma!r}")
    base = load_trace("miso100", seed=seed, duration_column=duration_column)
    rng = np.random.default_rng([seed, 7])
    gaps = rng.exponential(mean_interarrival_s, n)
    gaps[0] = 0.0
    subs = np.cumsum(gaps)
    pick = rng.integers(len(base), size=n)
    durs = [base[k].duration_s for k in pick]
    if duration_dist == "lognormal":
        mean = float(np.mean([b.duration_s for b in base]))
        mu = math.log(mean) - duration_sigma ** 2 / 2.0  # keeps the trace's mean
        drng = np.random.default_rng([seed, 11])
        durs = [max(1.0, float(x)) for x in drng.lognormal(mu, duration_sigma, n)]
    return [TraceJob(str(i), float(subs[i]), durs[i] * duration_scale,
                     base[k].workload, num_gpus=base[k].num_gpus) for i, k in enumerate(pick)]
