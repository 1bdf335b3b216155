"""Shared fixtures: the fast controller configuration and a virtual clock (helpers that are
plain functions, such as ``emu``, are in helpers.py)."""

from __future__ import annotations

import pytest
from helpers import FAST

from miso.controller import ControllerConfig
from miso.sched.clock import VirtualClock


@pytest.fixture
def fast_config() -> ControllerConfig:
    """A controller configuration with short profiling, polls and checkpoint timeouts."""
    return ControllerConfig(**FAST)


@pytest.fixture
def virtual_clock() -> VirtualClock:
    """A clock that moves only when the test advances it (no sleeping)."""
    return VirtualClock()
