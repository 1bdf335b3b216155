"""miso+'s options are the fields of its stages' option records (``misoplus.RECORDS``): each
option reaches every record that names it, the policy table lists them all, and a misspelt one
is an error naming it."""

from __future__ import annotations

import pytest

from miso.sched.estimators import TrueSpeeds
from miso.sched.policies import make_policy, policy_options
from miso.sched.policies.misoplus import RECORDS


def test_every_record_field_is_an_option_with_its_default() -> None:
    known = policy_options("miso+")
    for rec in RECORDS:
        for name, f in rec.__dataclass_fields__.items():
            assert known[name].default == f.default, name
    assert "estimator" in known and "max_jobs_per_gpu" in known  # MISO's, forwarded


def test_options_reach_their_stages() -> None:
    pol = make_policy("miso+", estimator=TrueSpeeds(), burst_jobs=0, batch_restart_frac=0.3,
                      reserve=False, wait_bias=2.0, wait_for_gpu=False, restart_s=30.0,
                      max_jobs_per_gpu=3)
    assert pol.bursts.opts.burst_jobs == 0
    assert pol.bursts.opts.batch_restart_frac == 0.3  # (the GPU choice's batch cap reads it)
    assert pol.economy.opts.reserve is False
    assert pol.admission.opts.wait_bias == 2.0
    assert pol.choice.opts.wait_for_gpu is False and pol.restarts.cost("x") == 30.0
    assert pol.max_jobs == 3
    assert make_policy("miso+", estimator=TrueSpeeds()).choice.opts.wait_for_gpu is True


def test_unknown_option_is_named() -> None:
    with pytest.raises(TypeError, match="burst_jbos"):
        make_policy("miso+", estimator=TrueSpeeds(), burst_jbos=3)
