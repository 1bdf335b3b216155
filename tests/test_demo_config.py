"""The demo's cluster configuration is valid under every policy it can run or compare
(`miso demo --compare nopart` once failed at start: strict policy options)."""

from __future__ import annotations

import pytest

from miso.cli.demo import demo_config
from miso.controller.controller import ControllerConfig, make_controller_policy
from miso.sched.policies import policy_names


@pytest.mark.parametrize("policy", policy_names())
def test_demo_config_builds_every_policy(policy: str) -> None:
    cfg = demo_config(policy)
    pol = make_controller_policy(ControllerConfig(**cfg))
    assert pol is not None
    if policy == "miso+":  # the policy that prices restarts is told the demo's restart cost
        assert cfg["policy_args"]["restart_s"] > 0
