"""Prometheus metrics of one controller (``prometheus-client``, its own ``CollectorRegistry``).

Counters and histograms are fed by :class:`miso.observe.observer.Observer` from the events and
decisions the controller handles; gauges (jobs by state and owner, the queue, per-GPU layout,
jobs, busy slices and phase) are read at scrape time from the controller's ``status()``
snapshot, so they cost nothing between scrapes. Every metric is documented in
``docs/metrics.md``; names follow Prometheus conventions (``miso_`` prefix, base units,
``_total`` counters).
"""

from __future__ import annotations

import re
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from miso.mig import gpu_model

RESTART_REASONS = ("profiling", "repartition", "preemption", "node_loss")
PHASES = ("idle", "profiling", "reconfiguring", "running")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_SHORT = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_LONG = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
         86400.0)
_TINY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_RATIO = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)

StatusFn = Callable[[], Mapping[str, Any]]


class Metrics:
    """The metric objects of one controller; :meth:`render` gives the text exposition."""

    def __init__(self, status: StatusFn | None = None) -> None:
        # no ``*_created`` series (prometheus-client's switch is process-wide; miso's
        # metrics have no use for them)
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter("miso_controller_events", "Events handled by the controller loop",
                              ["kind"], registry=r)
        self.decisions = Counter("miso_decisions", "Decisions of the scheduling core",
                                 ["kind"], registry=r)
        self.restarts = Counter("miso_job_restarts",
                                "Checkpoint-restarts of jobs caused by decisions or node loss",
                                ["reason"], registry=r)
        for reason in RESTART_REASONS:
            self.restarts.labels(reason)
        self.reconfigurations = Counter(
            "miso_reconfigurations", "MIG layout changes applied to a GPU", registry=r)
        self.failures = Counter("miso_failures", "Failures: jobs that failed, plans that could "
                                "not be applied", ["kind"], registry=r)
        for kind in ("job", "layout"):
            self.failures.labels(kind)
        self.completed = Counter("miso_jobs_completed", "Jobs that left the system",
                                 ["outcome"], registry=r)
        self.reconfig_s = Histogram("miso_reconfiguration_seconds",
                                    "Plan issued to layout applied (ApplyLayout, RunMps)",
                                    buckets=_SHORT, registry=r)
        self.profiling_s = Histogram("miso_profiling_seconds",
                                     "MPS profiling run: plan issued to profile reported",
                                     buckets=_SHORT, registry=r)
        self.checkpoint_s = Histogram("miso_checkpoint_seconds",
                                      "Checkpoint of the jobs a plan stops: asked to all exited",
                                      buckets=_SHORT, registry=r)
        self.jct_s = Histogram("miso_job_completion_seconds",
                               "Job completion time: submission to finish", buckets=_LONG,
                               registry=r)
        self.queueing_s = Histogram("miso_job_queueing_seconds",
                                    "Submission to the first plan that runs the job",
                                    buckets=_LONG, registry=r)
        self.predictor_error = Histogram(
            "miso_predictor_error_ratio",
            "|observed - predicted| / predicted relative speed of a job on its slice",
            buckets=_RATIO, registry=r)
        self.loop_lag_s = Histogram("miso_controller_loop_lag_seconds",
                                    "Time an event waits before the controller loop handles it",
                                    buckets=_TINY, registry=r)
        self.handle_s = Histogram("miso_controller_event_handling_seconds",
                                  "Time to handle one event (observe, decide, apply, log)",
                                  buckets=_TINY, registry=r)
        self.api_s = Histogram("miso_api_request_duration_seconds",
                               "HTTP API request latency", ["method", "route", "status"],
                               buckets=_TINY, registry=r)
        self._timings: dict[str, Histogram] = {
            "checkpoint": self.checkpoint_s, "loop_lag": self.loop_lag_s,
            "event_handling": self.handle_s, "reconfiguration": self.reconfig_s,
            "profiling": self.profiling_s}
        if status is not None:
            r.register(StatusCollector(status))

    def timing(self, name: str, seconds: float) -> None:
        """Record a named duration (``checkpoint``, ``loop_lag``, ``event_handling``, ...);
        unknown names are ignored."""
        h = self._timings.get(name)
        if h is not None and seconds >= 0:
            h.observe(seconds)

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.api_s.labels(method, route, str(status)).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StatusCollector(Collector):
    """Gauges read from a ``status()`` snapshot at scrape time."""

    def __init__(self, status: StatusFn) -> None:
        self.status = status

    def describe(self) -> Iterable[Metric]:
        return []  # dynamic: described when collected

    def collect(self) -> Iterable[Metric]:
        try:
            snap = self.status()
        except Exception:  # noqa: BLE001 - a scrape must not fail because status did
            return []
        return status_metrics(snap)


def status_metrics(snap: Mapping[str, Any]) -> list[Metric]:
    """The gauge families of one status snapshot (pure)."""
    jobs = list(snap.get("jobs") or [])
    now = float(snap.get("time") or 0.0)
    by = Tally((str(j.get("state", "")), str(j.get("owner_name") or j.get("owner") or ""))
               for j in jobs)
    g_jobs = GaugeMetricFamily("miso_jobs", "Jobs by state and owner", labels=["state", "owner"])
    for (state, owner), n in sorted(by.items()):
        g_jobs.add_metric([state, owner], n)
    queue = list(snap.get("queue") or [])
    sub = {j.get("id"): j.get("submitted_at") for j in jobs}
    waits = [now - float(sub[q]) for q in queue if sub.get(q) is not None]
    g_q = GaugeMetricFamily("miso_queue_length", "Jobs waiting in the scheduler's queue",
                            value=len(queue))
    g_wait = GaugeMetricFamily("miso_queue_oldest_wait_seconds",
                               "Wait of the longest-queued job (0 when the queue is empty)",
                               value=max(waits) if waits else 0.0)
    info = InfoMetricFamily("miso_gpu_layout", "MIG layout of each GPU",
                            labels=["gpu", "node", "model"])
    g_gj = GaugeMetricFamily("miso_gpu_jobs", "Jobs resident on the GPU", labels=["gpu"])
    g_busy = GaugeMetricFamily("miso_gpu_busy_compute_slices",
                               "Compute slices of the GPU's instances that run a job",
                               labels=["gpu"])
    g_tot = GaugeMetricFamily("miso_gpu_compute_slices", "Compute slices of the GPU",
                              labels=["gpu"])
    g_phase = GaugeMetricFamily("miso_gpu_phase", "1 for the GPU's current phase",
                                labels=["gpu", "phase"])
    for g in snap.get("gpus") or []:
        gid = str(g.get("id"))
        layout = ",".join(g.get("layout") or [])
        info.add_metric([gid, str(g.get("node", "")), str(g.get("model", ""))],
                        {"layout": layout})
        g_gj.add_metric([gid], len(g.get("jobs") or []))
        busy, total = busy_slices(g)
        g_busy.add_metric([gid], busy)
        g_tot.add_metric([gid], total)
        for ph in PHASES:
            g_phase.add_metric([gid, ph], 1.0 if g.get("phase") == ph else 0.0)
    return [g_jobs, g_q, g_wait, info, g_gj, g_busy, g_tot, g_phase, *owner_metrics(snap)]


def owner_metrics(snap: Mapping[str, Any]) -> list[Metric]:
    """Per-owner usage gauges when tenancy is on (``snap["owners"]``; labels: owner only)."""
    owners = snap.get("owners")
    if not owners:
        return []
    fams = {
        "in_use": GaugeMetricFamily("miso_owner_gpu_equivalents", "GPU-equivalents the owner "
                                    "holds (a slice counts its compute fraction)",
                                    labels=["owner"]),
        "usage_gpu_s": GaugeMetricFamily("miso_owner_usage_gpu_seconds", "Owner's usage "
                                         "(GPU-equivalent seconds, decayed by the half-life)",
                                         labels=["owner"]),
        "weight": GaugeMetricFamily("miso_owner_weight", "Owner's fair-share weight",
                                    labels=["owner"]),
        "fair_share": GaugeMetricFamily("miso_owner_fair_share", "Owner's fair-share factor "
                                        "2^(-U/S) (1: nothing used, 0.5: exactly its share)",
                                        labels=["owner"]),
    }
    seen: set[str] = set()
    for o, rec in sorted(owners.items()):
        # the user's name, as in ``miso_jobs`` (so a user's own series stay theirs when a
        # reader's view masks the others); its id when a former user had the same name
        label = str(rec.get("name") or o)
        label = str(o) if label in seen else label
        seen.add(label)
        for k, fam in fams.items():
            fam.add_metric([label], float(rec.get(k, 0.0)))
    return list(fams.values())


_OWNER = re.compile(rb'owner="((?:[^"\\]|\\.)*)"')


def mask_owners(text: bytes, keep: str) -> bytes:
    """The exposition ``text`` with every ``owner`` label other than ``keep`` read as
    ``other`` (the samples of one series summed): counts, no user names."""
    out: list[bytes] = []
    merged: dict[bytes, float] = {}
    order: list[bytes] = []
    for line in text.split(b"\n"):
        m = _OWNER.search(line)
        if line.startswith(b"#") or m is None:
            out.append(line)
            continue
        if m.group(1).decode(errors="replace") == keep and keep:
            out.append(line)
            continue
        series, _, value = line.replace(m.group(0), b'owner="other"').rpartition(b" ")
        if series not in merged:
            order.append(series)
            out.append(series)  # placeholder, filled below
            merged[series] = 0.0
        merged[series] += float(value)
    done = set()
    final = []
    for line in out:
        if line in merged and line not in done:
            final.append(line + b" " + repr(merged[line]).encode())
            done.add(line)
        elif line not in merged:
            final.append(line)
    return b"\n".join(final)


def busy_slices(g: Mapping[str, Any]) -> tuple[int, int]:
    """(compute slices running a job, compute slices of the GPU) of one status GPU entry."""
    try:
        model = gpu_model(str(g.get("model")))
    except KeyError:
        return 0, 0
    total = model.compute_slices
    if g.get("mps_shares") or (g.get("phase") == "profiling" and g.get("jobs")):
        return total, total
    busy = 0
    for pl in (g.get("assignment") or {}).values():
        prof = str(pl).split("@")[0]
        try:
            busy += model.profile(prof).compute_slices
        except KeyError:
            continue
    return busy, total
