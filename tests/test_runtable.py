"""The live runs' table: its per-GPU index follows every write."""

from dataclasses import dataclass

import pytest

from miso.controller.runtable import RunTable


@dataclass
class _Run:
    job: str
    gpu: str


def test_runs_on_a_gpu_follow_adds_moves_and_removals() -> None:
    t: RunTable[_Run] = RunTable()
    t["a"], t["b"], t["c"] = _Run("a", "g1"), _Run("b", "g1"), _Run("c", "g2")
    assert [r.job for r in t.on("g1")] == ["a", "b"]
    del t["a"]
    assert [r.job for r in t.on("g1")] == ["b"]
    t["b"] = _Run("b", "g2")  # the job's next run, elsewhere
    assert t.on("g1") == [] and [r.job for r in t.on("g2")] == ["c", "b"]
    assert t.pop("x", None) is None and t.pop("c").job == "c"
    assert dict(t) == {"b": _Run("b", "g2")} and [r.job for r in t.on("g2")] == ["b"]
    t.clear()
    assert t.on("g2") == [] and not t


def test_writes_that_would_skip_the_index_are_refused() -> None:
    t: RunTable[_Run] = RunTable()
    with pytest.raises(TypeError):
        t.update({"a": _Run("a", "g1")})
    with pytest.raises(TypeError):
        t.setdefault("a", _Run("a", "g1"))
    assert t.on("g1") == []
