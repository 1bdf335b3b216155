"""Text every ``miso`` command prints about itself and its users: the one-line error that
ends a command, and user text made safe for the terminal and for rich."""

from __future__ import annotations

import os
import re
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: Any) -> str:
    """``text`` without terminal control characters and escape sequences."""
    return _CONTROL.sub("", str(text))


def safe(text: Any) -> str:
    """User text made safe for rich: no control characters, markup escaped."""
    return escape(plain(text))


def fail(msg: str, code: int = 2) -> NoReturn:
    """End the command with ``error: <msg>`` (one line on stderr) and exit ``code``."""
    typer.echo(f"error: {plain(msg)}", err=True)
    raise typer.Exit(code)


#: Width of output that is not a terminal: wide enough that no table is cut or wrapped.
PIPE_WIDTH = 1000


def make_console(*, stderr: bool = False) -> Console:
    """A rich console. On a terminal it fits the terminal; piped or redirected (no terminal,
    no ``COLUMNS``) rich would cut tables to 80 columns (``poli…``), so it prints them in
    full instead."""
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    wide = not tty and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=PIPE_WIDTH if wide else None)
