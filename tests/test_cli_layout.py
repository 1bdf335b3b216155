"""The ``miso`` command's layout promises: client commands import no server, and every error
line is stripped of terminal control characters."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from miso.cli import app

#: pydantic: typer validates through it, ~0.15 s of a help's start (miso.cli.group)
HEAVY = ("fastapi", "uvicorn", "ray", "torch", "matplotlib", "miso.api.app", "miso.controller",
         "pydantic")


@pytest.mark.parametrize("argv", [["status", "--help"], ["cluster", "up", "--help"],
                                  ["user", "add", "--help"], ["predictor", "eval", "--help"]])
def test_the_command_and_its_help_import_no_server_ray_torch_or_pydantic(argv):
    code = ("import sys; from miso.cli import app\n"
            f"try:\n    app({argv!r})\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_the_api_client_needs_only_httpx():
    code = ("import sys, miso.api.client, miso.api.credentials\n"
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'pydantic', "
            "'miso.api.app', 'miso.api.server') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_the_api_package_still_offers_the_server_names():
    from miso.api import API, UserStore, create_app, require_user
    from miso.api.app import create_app as direct
    assert create_app is direct and API == "/api/v1" and callable(require_user)
    assert UserStore.__module__ == "miso.api.users"


def test_an_error_line_carries_no_control_characters():
    r = CliRunner().invoke(app, ["status", "--url", "ftp://x\a\b\x1b[31m"])
    assert r.exit_code == 2
    err = r.stderr if r.stderr_bytes is not None else r.output
    assert "error: --url ftp://x" in err
    assert not any(c in err for c in "\a\b\x1b")
