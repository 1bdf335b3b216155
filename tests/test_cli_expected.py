"""The commands people expect (issue 33): --version, shell completion, help in plain text,
--watch, --follow, --json twins, the history view, cancel by filter. Fast: CliRunner over a
fake API client."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner

from miso import __version__
from miso.cli import app

runner = CliRunner()


def test_version_and_completion() -> None:
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"miso {__version__}"
    env = {**os.environ, "_MISO_COMPLETE": "complete_bash", "COMP_WORDS": "miso sta",
           "COMP_CWORD": "1"}
    out = subprocess.run([sys.executable, "-m", "miso.cli"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert "status" in out.stdout.split()


def test_help_is_plain_text_not_rest() -> None:
    for argv in (["--help"], ["submit", "--help"], ["cluster", "up", "--help"]):
        r = runner.invoke(app, argv)
        assert r.exit_code == 0 and "``" not in r.output, argv
