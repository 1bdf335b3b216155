"""The guard of issue 27: every policy's full decision log (decisions with their ``why``, in
order) on three 150-job runs hashes as checked in (``benchmarks/sim/decision_hash.py``).

A change that alters any decision or explanation fails here; when the change is meant,
re-record with ``python benchmarks/sim/decision_hash.py --json
benchmarks/sim/results/decision_hash.json`` in its own commit and say what changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "sim" / "decision_hash.py"


def _guard():  # noqa: ANN202
    return load_script("decision_hash", SCRIPT)


GUARD = _guard()
WANT = json.loads(GUARD.RESULTS.read_text())


@pytest.mark.parametrize(("run", "entry"),
                         [(r, e) for r in sorted(WANT) for e in sorted(WANT[r])])
def test_decision_hash_unchanged(run: str, entry: str) -> None:
    got = GUARD.hashes(policies=(entry,), names=(run,))[run][entry]
    assert got == WANT[run][entry], f"decision log of {entry} on run {run!r} changed"


def test_every_entry_is_guarded() -> None:
    assert all(set(WANT[r]) == set(GUARD.ENTRIES) for r in WANT)
    assert set(WANT) == {r.name for r in GUARD.runs()}


def test_declined_records_unchanged() -> None:
    """miso+'s declined-repartition records (not decisions: left out of the hashes above)
    are guarded on their own (re-record with ``--declined`` when their words change)."""
    want = json.loads(GUARD.DECLINED.read_text())
    assert GUARD.declined_hashes() == want
