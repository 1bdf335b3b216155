"""What the agent knows of one job attempt: its directory, process, progress, rate and report.

The attempt's progress comes from a file the job writes (hostile input): it is read bounded,
without following links, and checked (:mod:`miso.agent.reports`); a bad one makes that
attempt's ``report_error``, never an error of the agent's poll.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miso.agent import logfile, reports, runas
from miso.attemptstatus import AttemptStatus
from miso.job import EXIT_CHECKPOINTED
from miso.mig import Placement

log = logging.getLogger(__name__)


@dataclass
class RateTracker:
    """Iteration-rate bookkeeping of one attempt: steady rate and phase-change detection.

    ``window`` seconds of progress (job-side timestamps) give a rate; the first full window
    after ``warmup`` seconds is the steady rate (the baseline). A rate that stays more than
    ``threshold`` away from the baseline for a further window is a speed change; the baseline
    then moves to the new rate.
    """

    window: float
    threshold: float
    warmup: float = 0.2
    samples: list[tuple[float, float]] = field(default_factory=list)
    steady: float | None = None
    baseline: float | None = None
    deviating_since: float | None = None
    change_seq: int = 0
    change: tuple[float, float] | None = None  # (observed, baseline) of the last change

    def add(self, t: float, it: float) -> None:
        if self.samples and (t <= self.samples[-1][0] or it < self.samples[-1][1]):
            return
        self.samples.append((t, it))
        t0 = self.samples[0][0]
        # Samples older than 4 windows go (the newest of them stays: rate() needs it); the
        # first stays until the steady rate is known. Before that only a second sample past
        # the warm-up let it go, so an attempt sampled twice within the warm-up (a fake
        # node's launches of its other jobs) kept every sample of its life, and each rate()
        # scanned them all.
        while len(self.samples) > 2 and self.samples[1][0] < t - 4 * self.window and \
                (self.steady is not None or self.samples[1][0] > t0 + self.warmup):
            self.samples.pop(0)
            t0 = self.samples[0][0]
        self._update()

    def rate(self, span: float) -> float | None:
        """Rate over the last ``span`` seconds of samples (None if too short)."""
        if len(self.samples) < 2:
            return None
        t1, i1 = self.samples[-1]
        for t0, i0 in reversed(self.samples):  # the newest sample at least span old
            if t0 <= t1 - span:
                return (i1 - i0) / (t1 - t0) if t1 > t0 else None
        return None

    def _update(self) -> None:
        t_first = self.samples[0][0]
        t_last = self.samples[-1][0]
        if self.steady is None:
            if t_last - t_first >= self.warmup + self.window:
                self.steady = self.rate(self.window)
                self.baseline = self.steady
            return
        cur = self.rate(self.window)
        if cur is None or not self.baseline:
            return
        if abs(cur / self.baseline - 1.0) > self.threshold:
            if self.deviating_since is None:
                self.deviating_since = t_last
            elif t_last - self.deviating_since >= self.window:
                self.change_seq += 1
                self.change = (cur, self.baseline)
                self.baseline = cur
                self.deviating_since = None
        else:
            self.deviating_since = None


@dataclass
class Attempt:
    """One process run of one job."""

    job: str
    attempt: int
    command: list[str]
    gpu: int
    placement: Placement
    mps_pct: int | None
    proc: subprocess.Popen[bytes]
    dir: Path
    progress_file: Path
    flag_file: Path
    log_file: Path
    started: float
    rates: RateTracker
    checkpoint_requested: bool = False
    killed: bool = False
    returncode: int | None = None
    ended: float | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    exit_record: Path | None = None
    fenced: bool = False
    #: why the guard ended the job for one of its bounds ("" when it did not)
    limit: str = ""
    token: str = ""
    #: Why this attempt's reports are invalid (its progress file is bad), "" when they are not.
    report_error: str = ""

    @property
    def checkpointable(self) -> bool | None:
        """True once the job announced the helper (unless it said it cannot save), False
        when it reported nothing within the agent's grace period, None before that."""
        if self.progress.get("helper"):
            return bool(self.progress.get("checkpointable", True))
        return None if self.progress or not self.no_helper else False

    no_helper: bool = False


def read_progress(a: Attempt) -> None:
    """Take the job's progress file if it is valid; else mark the attempt's reports
    invalid (the last valid progress stays)."""
    if not a.progress_file.exists() and not a.progress_file.is_symlink():
        return
    raw = runas.read_json(a.progress_file)
    try:
        if raw is None:
            raise reports.BadReport("the progress file is not a regular file of at most "
                                    "1 MiB of JSON")
        data = reports.check_progress(raw)
    except reports.BadReport as e:
        a.report_error = f"invalid progress file: {e}"
        return
    a.report_error = ""
    a.progress = data
    if "time" in data and "iteration" in data:
        a.rates.add(float(data["time"]), float(data["iteration"]))


def refresh(a: Attempt, node: str, no_helper_after: float) -> None:
    """Bring an attempt up to date before a report: progress, helper grace, exit status."""
    try:
        read_progress(a)
    except Exception as e:  # noqa: BLE001 - a job's file never stops the node's poll
        log.exception("%s: reading %s", node, a.progress_file)
        a.report_error = f"invalid progress file: {type(e).__name__}"
    if not a.progress and time.time() - a.started > no_helper_after:
        a.no_helper = True
    if a.returncode is None:
        rc = a.proc.poll()
        if rc is not None:
            a.returncode, a.ended = rc, time.time()
            with contextlib.suppress(Exception):
                read_progress(a)  # final words
            rec = reports.check_exit_record(
                runas.read_json(a.exit_record) if a.exit_record else None)
            a.fenced = rec is not None and rec["fenced"]
            a.limit = rec["limit"] if rec is not None else ""


def attempt_report(a: Attempt) -> dict[str, Any]:
    """Plain-data state of an attempt."""
    p = a.progress
    ck = p.get("checkpoint") if isinstance(p.get("checkpoint"), dict) else None
    status = AttemptStatus.RUNNING if a.returncode is None else (
        AttemptStatus.FINISHED if a.returncode == 0 else
        AttemptStatus.CHECKPOINTED if a.returncode == EXIT_CHECKPOINTED else
        AttemptStatus.KILLED if a.killed else AttemptStatus.FENCED if a.fenced else
        AttemptStatus.LIMIT if a.limit else AttemptStatus.FAILED)
    tail = ""
    if status is AttemptStatus.FAILED:
        try:
            tail = "\n".join(logfile.tail_lines(a.log_file, 20, max_bytes=64 << 10))
        except OSError:
            tail = ""
    return {
        "job": a.job, "attempt": a.attempt, "pid": a.proc.pid, "gpu": a.gpu,
        "placement": [a.placement.start, a.placement.profile], "mps_pct": a.mps_pct,
        "status": status, "returncode": a.returncode,
        "iteration": p.get("iteration"), "total": p.get("total"), "time": p.get("time"),
        "start_iteration": p.get("start_iteration"),
        "checkpoint_iteration": ck.get("iteration") if ck else None,
        "checkpoint_path": ck.get("path") if ck else None,
        "steady_rate": a.rates.steady, "rate": a.rates.rate(a.rates.window),
        "change_seq": a.rates.change_seq,
        "change": list(a.rates.change) if a.rates.change else None,
        "checkpoint_requested": a.checkpoint_requested,
        "checkpointable": a.checkpointable,
        "started": a.started, "ended": a.ended, "log": str(a.log_file), "log_tail": tail,
        "report_error": a.report_error, "limit": a.limit,
    }
