"""Every code block of README.md runs as written (as SimPy runs its documentation examples).

The blocks run in order in one fresh directory with a private HOME (so ``~/.miso`` is new), the
way a new user follows the README top to bottom: a ``python`` block whose first line is
``# NAME.py`` is that file (written, not run), a ``bash`` block runs under ``bash -e``. A block
marked ``<!-- no-test: why -->`` on the line above is not run (counted below, so a new one is a
visible change); ``<!-- test: slow -->`` runs only in the slow suite (it starts a cluster or
runs for minutes). After a block that submits ``--name NAME`` the test waits for that job to
end and checks that it finished.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: Blocks marked no-test; raise it only with a reason in the README.
EXPECTED_NOT_RUN = 3

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*(no-test|test):\s*(.*?)\s*-->")
_FILE = re.compile(r"^# ([\w.-]+\.py)\n")
_SUBMIT = re.compile(r"miso submit\b.*--name (\S+)")


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, for a no-test block
    slow: bool


def readme_blocks(text: str) -> list[Block]:
    out = []
    for m in _FENCE.finditer(text):
        before = [ln for ln in text[:m.start()].splitlines() if ln.strip()]
        mark = _MARK.fullmatch(before[-1].strip()) if before else None
        out.append(Block(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                         mark.group(2) if mark and mark.group(1) == "no-test" else None,
                         bool(mark and mark.group(1) == "test" and mark.group(2) == "slow")))
    return out


BLOCKS = readme_blocks(README.read_text())


def test_every_block_is_run_or_marked_with_a_reason() -> None:
    assert len(BLOCKS) >= 8
    for b in BLOCKS:
        assert b.lang in ("bash", "python"), f"README line {b.line}: unknown block {b.lang!r}"
        if b.lang == "python":
            assert _FILE.match(b.code), f"README line {b.line}: start with `# NAME.py`"
        if b.not_run is not None:
            assert len(b.not_run) > 10, f"README line {b.line}: say why it cannot run"
    not_run = [b for b in BLOCKS if b.not_run is not None]
    assert len(not_run) == EXPECTED_NOT_RUN, [(b.line, b.not_run) for b in not_run]
    assert len(BLOCKS) - len(not_run) >= 4


@pytest.fixture
def user(tmp_path: Path) -> dict[str, str]:
    """A new user's shell: a private HOME, no miso variables, this environment's `miso`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MISO_", "RAY_ADDRESS"))}
    env.update(HOME=str(tmp_path / "home"), RAY_USAGE_STATS_ENABLED="0",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    return env


def _miso(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["miso", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _wait_finished(env: dict[str, str], cwd: Path, name: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    state = "?"
    while time.time() < deadline:
        r = _miso(env, cwd, "status", "--json")
        jobs = [j for j in json.loads(r.stdout)["jobs"] if j["name"] == name] \
            if r.returncode == 0 else []
        state = jobs[0]["state"] if jobs else "?"
        if state in ("finished", "failed", "cancelled"):
            break
        time.sleep(2)
    logs = _miso(env, cwd, "logs", name, "--tail", "30").stdout
    assert state == "finished", f"job {name} {state}: {jobs[0].get('why') if jobs else ''}\n{logs}"


def _run(blocks: list[Block], env: dict[str, str], cwd: Path) -> None:
    try:
        for b in blocks:
            if b.lang == "python":
                m = _FILE.match(b.code)
                assert m is not None
                (cwd / m.group(1)).write_text(b.code)
                continue
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b.code], env=env,
                               cwd=cwd, capture_output=True, text=True, timeout=1200)
            assert r.returncode == 0, (f"README block at line {b.line} failed ({r.returncode})"
                                       f":\n{b.code}\n--- stdout\n{r.stdout[-3000:]}\n"
                                       f"--- stderr\n{r.stderr[-3000:]}")
            for name in _SUBMIT.findall(b.code):
                _wait_finished(env, cwd, name)
    finally:
        if (Path(env["HOME"]) / ".miso" / "cluster" / "cluster.json").exists():
            _miso(env, cwd, "cluster", "down")


def test_the_fast_blocks_run_as_written(user: dict[str, str], tmp_path: Path) -> None:
    fast = [b for b in BLOCKS if b.not_run is None and not b.slow]
    assert fast
    _run(fast, user, tmp_path / "work")


@pytest.mark.slow
@pytest.mark.ray
def test_every_block_runs_as_written_in_order(user: dict[str, str], tmp_path: Path) -> None:
    """The whole README on an emulated cluster on this CPU machine (the PyTorch example needs
    the extra [train], which CI installs)."""
    pytest.importorskip("torch")
    _run([b for b in BLOCKS if b.not_run is None], user, tmp_path / "work")
