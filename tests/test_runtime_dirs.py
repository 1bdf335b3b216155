"""Issue 26, item 1: the runtime dirs of miso's root processes (Ray's temp dir above all) are
fresh, private (0700, ours, lstat-checked) and refused when another account prepared them."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miso import raycluster as rc
from miso import runtimedir
from miso.cli import app
from miso.deploy import slurm
from tests.pathaudit import can_write, writable_dirs

OTHER = 54321  # a uid that is not ours (no account needed for mode bits)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def ray_layout(temp: str) -> Path:
    """What Ray 2.x makes of its temp dir on start (node.py: temp, session, logs, sockets,
    each through try_to_create_directory: makedirs + chmod 0777; a session_latest link)."""
    session = Path(temp) / "session_2026-01-01_00-00-00_000000_1"
    for d in (Path(temp), session, session / "logs", session / "sockets"):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o777)
    (Path(temp) / "session_latest").symlink_to(session)
    return session


def test_local_ray_temp_dir_is_fresh_private_and_nothing_below_is_writable() -> None:
    a, b = rc.private_temp_dir(), rc.private_temp_dir()
    try:
        assert a != b  # fresh per start, never a reused name
        for t in (a, b):
            parent = Path(t).parent
            st = os.lstat(parent)
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            assert stat.S_IMODE(st.st_mode) == 0o700
            assert len(t) <= runtimedir.RAY_TEMP_MAX
        session = ray_layout(a)
        assert stat.S_IMODE(os.stat(session).st_mode) & 0o002  # Ray's own 0777 ...
        assert writable_dirs([a, Path(a).parent], OTHER, {OTHER}) == []  # ... out of reach
    finally:
        for t in (a, b):
            shutil.rmtree(Path(t).parent, ignore_errors=True)


def test_the_old_fixed_temp_dir_layout_is_what_the_audit_catches() -> None:
    top = Path(tempfile.mkdtemp())  # stands for /tmp (the old /tmp/miso-ray-<sha1>)
    try:
        os.chmod(top, 0o755)
        old = top / "miso-ray-0123456789"  # Ray given a dir directly: it makes it 0777
        session = ray_layout(str(old))
        assert can_write(old, OTHER, {OTHER}) and can_write(session / "logs", OTHER, {OTHER})
        assert str(old) in writable_dirs([old], OTHER, {OTHER})
    finally:
        shutil.rmtree(top)


def test_make_private_creates_0700_and_accepts_our_own_restart(tmp_path: Path) -> None:
    d = runtimedir.make_private(tmp_path / "rt")
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700
    assert runtimedir.make_private(d) == d  # a restart of the same unit


def test_make_private_refuses_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "rt").symlink_to(target)
    with pytest.raises(runtimedir.UnsafeRuntimeDir, match="symbolic link"):
        runtimedir.make_private(tmp_path / "rt")


def test_make_private_refuses_an_open_dir_and_a_file(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(runtimedir.UnsafeRuntimeDir, match="mode 777"):
        runtimedir.make_private(tmp_path / "open")
    (tmp_path / "file").write_text("")
    with pytest.raises(runtimedir.UnsafeRuntimeDir, match="not a directory"):
        runtimedir.make_private(tmp_path / "file")


@root_only
def test_make_private_refuses_a_dir_of_another_uid(tmp_path: Path) -> None:
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    os.chown(d, OTHER, OTHER)
    with pytest.raises(runtimedir.UnsafeRuntimeDir, match=f"uid {OTHER}"):
        runtimedir.make_private(d)


def test_ray_temp_dir_keeps_socket_paths_in_bounds() -> None:
    assert runtimedir.ray_temp_dir("/tmp/miso-ray-abcdefgh").endswith("/r")
    with pytest.raises(ValueError, match="AF_UNIX"):
        runtimedir.ray_temp_dir("/tmp/" + "x" * 60)


def test_slurm_runtime_dir_is_not_predictable_from_the_job_id() -> None:
    a, b = slurm.temp_dir_for(1234), slurm.temp_dir_for(1234)
    assert a != b and a.startswith("/tmp/miso-slurm-1234-")
    assert len(runtimedir.ray_temp_dir(slurm.temp_dir_for(10**12 - 1))) <= \
        runtimedir.RAY_TEMP_MAX


@root_only
def test_miso_node_refuses_a_runtime_dir_another_account_prepared(tmp_path: Path) -> None:
    """The Slurm attack: another user pre-creates the dir with a ``ray_current_cluster``
    link; ``miso node`` (root) refuses it before Ray starts, writing nothing there."""
    pre = tmp_path / "miso-slurm-77-x"
    pre.mkdir(mode=0o777)
    victim = tmp_path / "root-only"
    victim.write_text("secret")
    (pre / "ray_current_cluster").symlink_to(victim)
    os.chown(pre, OTHER, OTHER)
    sd = tmp_path / "state"
    r = CliRunner().invoke(app, ["node", "--head", "--temp-dir", str(pre), "--state-dir",
                                 str(sd), "--no-agent", "--join-timeout", "5"])
    assert r.exit_code == 2, r.output
    assert "refusing" in r.output and f"uid {OTHER}" in r.output
    assert victim.read_text() == "secret"
