"""The guard of issue 27: the hash of every policy's full decision log (each decision with its
``why``, in order, with its time) on three 150-job runs. A refactoring of the policies must
leave every hash unchanged; ``tests/test_decision_hash.py`` compares against the hashes
checked in at ``benchmarks/sim/results/decision_hash.json``.

    python benchmarks/sim/decision_hash.py [--json FILE] [--policy P,...] [--run NAME,...]
        [--declined FILE]

miso+'s :class:`~miso.sched.decisions.RepartitionDeclined` records (issue 33) decide nothing:
they are left out of these hashes (recorded before they existed) and hashed on their own
(``--declined``, ``results/declined_hash.json``).

Runs (each exercises a different part of the policies):

* ``busy``: 150 Poisson jobs every 30 s on 6 A100s, restart 60 s: profiling, repartitions,
  rebalancing.
* ``nockpt``: 150 jobs every 20 s on 4 GPUs, restart 120 s, 40 % cannot checkpoint, heuristic
  estimator: queueing, restart pricing, pinning.
* ``tenancy``: 150 jobs every 30 s on 6 GPUs, two owners 80/20, 15 % high priority, fair share
  with reclaim and preemption on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from miso.sched.decisions import Decision, RepartitionDeclined
from miso.sched.tenancyconfig import HIGH, TenancyConfig
from miso.sim.run import ALL_POLICIES, run_policy
from miso.sim.traces import TraceJob, assign_tenants, poisson_jobs
from miso.sim.world import WorldConfig

RESULTS = Path(__file__).parent / "results" / "decision_hash.json"


@dataclass(frozen=True)
class Run:
    name: str
    jobs: list[TraceJob]
    cfg: WorldConfig
    seed: int
    tenancy: TenancyConfig | None = None


def _prioritised(jobs: list[TraceJob], frac: float, seed: int) -> list[TraceJob]:
    rng = np.random.default_rng([seed, 27])
    return [replace(j, priority=HIGH) if rng.random() < frac else j for j in jobs]


def runs() -> list[Run]:
    """The three runs (see the module docstring)."""
    busy = poisson_jobs(150, seed=1, mean_interarrival_s=30.0)
    nock = poisson_jobs(150, seed=2, mean_interarrival_s=20.0)
    ten = _prioritised(assign_tenants(poisson_jobs(150, seed=3, mean_interarrival_s=30.0),
                                      2, 0.8, seed=3), 0.15, 3)
    return [
        Run("busy", busy, WorldConfig(n_gpus=3, restart_s=60.0), 1),
        Run("nockpt", nock, WorldConfig(n_gpus=2, restart_s=120.0, no_checkpoint_frac=0.4,
                                        predictor="heuristic"), 2),
        Run("tenancy", ten, WorldConfig(n_gpus=3, restart_s=60.0), 3,
            TenancyConfig(fair_share=True, reclaim=True, preempt=True)),
    ]


def canon(x: Any) -> Any:
    """A JSON-able canonical form (floats exact via repr, mappings sorted)."""
    if isinstance(x, Enum):
        return canon(x.value)
    if isinstance(x, float):
        return repr(x) if math.isfinite(x) else str(x)
    if isinstance(x, bool | int | str) or x is None:
        return x
    if isinstance(x, Mapping):
        return {str(k): canon(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, list | tuple | set | frozenset):
        items = [canon(v) for v in x]
        return sorted(items, key=repr) if isinstance(x, set | frozenset) else items
    if hasattr(x, "__dataclass_fields__"):
        return {f.name: canon(getattr(x, f.name)) for f in fields(x)}
    return repr(x)


#: Entries hashed besides the policy table's defaults: name -> (policy, options). miso+'s
#: default profiles rarely at these loads (a newcomer is profiled only when no arrival is
#: expected during the run), so its profiling path is hashed with ``profile_when="always"``.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "miso+/profile-always": ("miso+", {"profile_when": "always"}),
}
ENTRIES = (*ALL_POLICIES, *VARIANTS)


def decision_log(run: Run, entry: str) -> list[tuple[float, Decision]]:
    policy, kw = VARIANTS.get(entry, (entry, {}))
    r = run_policy(policy, run.jobs, run.cfg, run.seed, record=True, tenancy=run.tenancy,
                   **kw)
    # RepartitionDeclined is a record, not an action (miso.sched.policies.declined): left
    # out, so the hashes recorded before it existed still prove every decision unchanged.
    return [(t, d) for t, d in r.log
            if isinstance(d, Decision) and not isinstance(d, RepartitionDeclined)]


#: The declined-repartition records' own guard: miso+'s records on the three runs, hashed.
DECLINED = Path(__file__).parent / "results" / "declined_hash.json"


def declined_hashes() -> dict[str, str]:
    """Per run, the hash of miso+'s :class:`RepartitionDeclined` records (the gain and
    restart price of each repartition it gave up, with their words)."""
    out = {}
    for run in runs():
        r = run_policy("miso+", run.jobs, run.cfg, run.seed, record=True, tenancy=run.tenancy)
        out[run.name] = digest([(t, d) for t, d in r.log if isinstance(d, RepartitionDeclined)])
    return out


def digest(log: list[tuple[float, Decision]]) -> str:
    h = hashlib.sha256()
    for t, d in log:
        line = json.dumps([repr(t), type(d).__name__, canon(d)], sort_keys=True)
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def kinds(log: list[tuple[float, Decision]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, d in log:
        k = type(d).__name__
        if k == "RequeueJob":
            k += ":" + re.sub(r"[0-9]+", "N", str(getattr(d, "reason", "")).split(":")[0])[:24]
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def hashes(policies: tuple[str, ...] = ENTRIES, names: tuple[str, ...] | None = None,
           verbose: bool = False) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for run in runs():
        if names is not None and run.name not in names:
            continue
        for p in policies:
            log = decision_log(run, p)
            out.setdefault(run.name, {})[p] = digest(log)
            if verbose:
                print(f"{run.name:8s} {p:20s} {out[run.name][p][:16]} {len(log):5d} "
                      f"{kinds(log)}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None, help="write the hashes here")
    ap.add_argument("--policy", default=",".join(ENTRIES))
    ap.add_argument("--run", default=None)
    ap.add_argument("--declined", default=None,
                    help="write the hashes of miso+'s declined-repartition records here")
    ap.add_argument("--check", action="store_true", help=f"compare with {RESULTS}")
    a = ap.parse_args()
    names = tuple(a.run.split(",")) if a.run else None
    got = hashes(tuple(a.policy.split(",")), names, verbose=True)
    if a.json:
        Path(a.json).write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if a.declined:
        Path(a.declined).write_text(json.dumps(declined_hashes(), indent=1) + "\n")
    if a.check:
        want = json.loads(RESULTS.read_text())
        bad = [(r, p) for r, ps in got.items() for p, h in ps.items() if want[r][p] != h]
        print("identical" if not bad else f"CHANGED: {bad}")
        raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
