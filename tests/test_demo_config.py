"""The demo's policy options are valid under every policy it can run or compare
(`miso demo --compare nopart` once failed at start: strict policy options), and OptSta gets a
real static layout for the demo's stream."""

from __future__ import annotations

import pytest

from miso.cli.demo_cluster import demo_jobs, policy_args
from miso.controller.controller import ControllerConfig, make_controller_policy
from miso.sched.policies import policy_names


@pytest.mark.parametrize("policy", policy_names())
def test_demo_policy_args_build_every_policy(policy: str) -> None:
    stream = demo_jobs(8, seed=1)
    args = policy_args(policy, stream, 2, "A100-40GB")
    pol = make_controller_policy(ControllerConfig(policy=policy, policy_args=args))
    assert pol is not None
    if policy == "optsta":
        assert args["layout"]  # a real static partition, not one whole-GPU instance
