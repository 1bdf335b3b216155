"""The policy-size measure (``benchmarks/sim/policy_size.py``, issue 27's "miso+'s shipped code")
derives miso+'s files from imports: it must keep finding them. A ``from miso.sched import
fairorder`` once pulled ``miso.sched``'s ``__init__`` (and with it every profile) into NoPart's
import closure, so miso+'s list came out empty and ``--max-sloc`` passed with 0 lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import load_script

pytest.importorskip("radon")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sim" / "policy_size.py"


def _script():  # noqa: ANN202
    return load_script("policy_size", SCRIPT)


PS = _script()


def test_from_package_import_submodule_counts_the_submodule_only() -> None:
    got = PS.imports("miso.sched.tenancy")  # from miso.sched import fairorder
    assert "miso.sched.fairorder" in got
    assert "miso.sched" not in got


def test_misoplus_own_modules_hold_its_plugins_not_the_shared_base() -> None:
    own = PS.own_modules("miso+")
    assert "miso.sched.policies.misoplus" in own
    assert "miso.sched.policies.admission" in own
    assert "miso.sched.policies.base" not in own  # shared with MISO and the baselines
    assert "miso.sched.policies.miso" not in own
