"""The controller process's collector is tuned once (miso.controller.gctune)."""

from __future__ import annotations

import gc
import threading

import pytest

from miso.controller import gctune


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch):
    """As in a process where no controller started yet; the collector restored after."""
    before = gc.get_threshold()
    monkeypatch.setattr(gctune, "_done", threading.Event())
    monkeypatch.delenv("MISO_GC_TUNE", raising=False)
    yield before
    gc.set_threshold(*before)


def test_tune_gc_freezes_and_raises_thresholds_once(fresh_process) -> None:
    assert gctune.tune_gc() is True
    assert gc.get_threshold() == (gctune.GEN0, gctune.GEN1, gctune.GEN2)
    assert gc.get_freeze_count() > 0
    gc.set_threshold(*fresh_process)
    assert gctune.tune_gc() is False  # a second controller in the process changes nothing
    assert gc.get_threshold() == fresh_process


def test_tune_gc_keeps_defaults_when_disabled(fresh_process, monkeypatch) -> None:
    monkeypatch.setenv("MISO_GC_TUNE", "0")
    assert gctune.tune_gc() is False
    assert gc.get_threshold() == fresh_process
