"""Issue 26, item 7: what a job wrote in its checkpoint dir is read by root without following
its links; a resume path lies inside that dir; a checkpoint claim is bounded by the total."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miso import jobpaths
from miso.agent.reports import BadReport, check_progress
from miso.controller.launcher import resume_point
from miso.job import LAST_CHECKPOINT, last_checkpoint


def record(ck: Path, path: str, iteration: int = 5) -> None:
    (ck / ".miso").mkdir(parents=True, exist_ok=True)
    (ck / ".miso" / LAST_CHECKPOINT).write_text(json.dumps(
        {"iteration": iteration, "path": path, "time": 1.0, "attempt": 1}))


def test_a_linked_dot_miso_is_not_followed(tmp_path: Path) -> None:
    root_only = tmp_path / "root-only"
    record(root_only, str(root_only / "secret.ckpt"))  # root's own JSON of that name
    (root_only / "secret.ckpt").write_text("x")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / ".miso").symlink_to(root_only / ".miso")
    assert last_checkpoint(ck) is None
    assert resume_point(None, None, ck) == (None, None)


def test_a_resume_path_outside_the_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    outside = tmp_path / "root-only.ckpt"
    outside.write_text("x")
    for p in (str(outside), str(ck / ".." / "root-only.ckpt")):
        record(ck, p)
        assert resume_point(None, None, ck) == (None, None), p
    assert resume_point(3, str(outside), ck) == (None, None)  # a stored report's path too


def test_a_resume_path_through_a_link_inside_is_refused(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    secret = tmp_path / "root-only"
    secret.mkdir()
    (secret / "model.ckpt").write_text("x")
    ck.mkdir()
    (ck / "sub").symlink_to(secret)
    record(ck, str(ck / "sub" / "model.ckpt"))
    assert resume_point(None, None, ck) == (None, None)  # no existence oracle on root's paths
    (ck / "real").mkdir()
    (ck / "real" / "model.ckpt").write_text("x")
    record(ck, str(ck / "real" / "model.ckpt"))
    assert resume_point(None, None, ck) == (5, str(ck / "real" / "model.ckpt"))


def test_a_checkpoint_claim_beyond_the_total_is_not_recorded(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "m.ckpt").write_text("x")
    record(ck, str(ck / "m.ckpt"), iteration=999_999_999)
    assert resume_point(None, None, ck, total=10) == (None, None)
    with pytest.raises(BadReport, match="beyond the job's total"):
        check_progress({"iteration": 10, "total": 10,
                        "checkpoint": {"iteration": 999_999_999, "path": str(ck / "m.ckpt")}})
    assert check_progress({"iteration": 10, "total": 10, "checkpoint": {
        "iteration": 10, "path": str(ck / "m.ckpt")}})["checkpoint"]["iteration"] == 10


def test_inside_is_lexical_and_strict() -> None:
    assert jobpaths.inside("/a/b", "/a/b/c/d") == ["c", "d"]
    for p in ("/a/b", "/a/bc/d", "/a/b/../c", "c/d", "/a/b/\0"):
        assert jobpaths.inside("/a/b", p) is None, p
