"""An agent refuses a raylet that kills a dead worker's children (issue 26: KubeRay or a
hand-run ``ray start`` without ``RAY_kill_child_processes_on_worker_exit=0``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from miso.cluster.rayletenv import SETTING, raylet_setting, refuse_unless_children_kept


def fake_proc(root: Path, env: list[str] | None, parent_comm: str = "raylet") -> Path:
    """A /proc of a worker (pid 300) whose parent (pid 200) is ``parent_comm`` with ``env``."""
    (root / "300").mkdir(parents=True)
    (root / "300" / "stat").write_text("300 (ray::AgentActor) S 200 300 300 0")
    (root / "300" / "comm").write_text("ray::AgentActor\n")
    (root / "200").mkdir()
    (root / "200" / "stat").write_text("200 (raylet) S 1 200 200 0")
    (root / "200" / "comm").write_text(parent_comm + "\n")
    if env is not None:
        (root / "200" / "environ").write_bytes(b"\0".join(e.encode() for e in env) + b"\0")
    return root


def test_a_raylet_without_the_setting_is_refused_with_what_to_do(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, ["PATH=/usr/bin", "RAY_USAGE_STATS_ENABLED=0"])
    assert raylet_setting(300, proc) == ""
    with pytest.raises(RuntimeError) as e:
        refuse_unless_children_kept(300, proc)
    assert f"{SETTING}=0" in str(e.value) and "\n" not in str(e.value)


def test_a_raylet_that_kills_children_explicitly_is_refused(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, [f"{SETTING}=1"])
    with pytest.raises(RuntimeError, match="it has 1"):
        refuse_unless_children_kept(300, proc)


def test_a_raylet_with_the_setting_passes(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, ["A=b", f"{SETTING}=0"])
    assert raylet_setting(300, proc) == "0"
    refuse_unless_children_kept(300, proc)


def test_not_under_a_raylet_or_unreadable_only_warns(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    proc = fake_proc(tmp_path / "a", None, parent_comm="bash")
    assert raylet_setting(300, proc) is None
    refuse_unless_children_kept(300, proc)
    proc = fake_proc(tmp_path / "b", None)  # a raylet whose environment cannot be read
    assert raylet_setting(300, proc) is None
    refuse_unless_children_kept(300, proc)
    assert SETTING in caplog.text


def test_this_process_is_not_under_a_raylet() -> None:
    assert raylet_setting() is None
