"""Shared test helper: poll until a condition holds (for tests of real processes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Return the first truthy value of ``pred()``, polling every 50 ms; fail after
    ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("condition not met in time")
