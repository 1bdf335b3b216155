"""Checks of command-line input shared by every ``miso`` command.

Each check returns the checked value or raises :class:`InputError` with one line that names the
flag (or file) and the problem; the root command (:mod:`miso.cli`) prints that line on stderr
and exits with status 2 (as for any usage error), so a command body only calls the checks it needs::

    checks.positive(mean_interarrival, "--mean-interarrival")
    text = checks.read_text(path, "--speeds", max_bytes=checks.MIB)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TypeVar

import typer

MIB = 1024 * 1024
T = TypeVar("T")


class InputError(typer.BadParameter):
    """Bad command-line input; the message is one line naming the flag or file.

    A usage error to typer, so any typer app reports it and exits 2 (the root command prints
    it as one line).
    """

    def format_message(self) -> str:
        return self.message


def _show(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def number(value: float, flag: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False) -> float:
    """A finite number in [low, high] (``(low, high]`` with ``low_open``); bounds optional."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{flag} {_show(value)}: must be a finite number")
    if low is not None and (value <= low if low_open else value < low):
        raise InputError(f"{flag} {_show(value)}: must be {'>' if low_open else '>='} "
                         f"{_show(low)}")
    if high is not None and value > high:
        raise InputError(f"{flag} {_show(value)}: must be <= {_show(high)}")
    return value


def positive(value: float, flag: str) -> float:
    """A finite number > 0."""
    return number(value, flag, low=0, low_open=True)


def non_negative(value: float, flag: str) -> float:
    """A finite number >= 0."""
    return number(value, flag, low=0)


def fraction(value: float, flag: str) -> float:
    """A finite number in [0, 1]."""
    return number(value, flag, low=0, high=1)


def names(value: str, flag: str) -> list[str]:
    """The non-empty items of a comma-separated list; at least one."""
    items = [p.strip() for p in value.split(",") if p.strip()]
    if not items:
        raise InputError(f"{flag} {value!r}: names nothing (give a comma-separated list)")
    return items


def read_bytes(path: Path, flag: str, *, max_bytes: int) -> bytes:
    """The content of ``path``, refusing more than ``max_bytes`` (so ``/dev/zero`` ends)."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise InputError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{flag} {path}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise InputError(f"{flag} {path}: larger than {max_bytes // MIB} MiB")
    return data


def decode_utf8(data: bytes, where: str) -> str:
    """UTF-8 text (a leading BOM is dropped); the error names the first bad byte and its line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}; "
                         "save the file as UTF-8)") from None


def read_text(path: Path, flag: str, *, max_bytes: int) -> str:
    """:func:`read_bytes` decoded as UTF-8."""
    return decode_utf8(read_bytes(path, flag, max_bytes=max_bytes), f"{flag} {path}")


def read_json(path: Path, flag: str, *, max_bytes: int = MIB) -> object:
    """Parsed JSON of a UTF-8 file of at most ``max_bytes``."""
    text = read_text(path, flag, max_bytes=max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{flag} {path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{flag} {path}: not valid JSON: nested too deeply") from None


def output_file(path: Path, flag: str) -> Path:
    """A path a file can be written to (its directory is created); checked before any work."""
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a directory, not a file")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except FileExistsError:
        raise InputError(f"{flag} {path}: {path.parent} is not a directory") from None
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from None
    if not existed:
        path.unlink(missing_ok=True)
    return path


def output_dir(path: Path, flag: str) -> Path:
    """A directory files can be written into (created if missing)."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {path}: is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except FileExistsError:
        raise InputError(f"{flag} {path}: a parent of it is a file") from None
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    return path


def write_text(path: Path, text: str, flag: str) -> None:
    """Write ``text`` to ``path``; an I/O error (disk full, ...) becomes one line."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise InputError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from None


def alias(value: T | None, old_value: T | None, flag: str, old_flag: str) -> T | None:
    """The value given with ``flag`` or with its old spelling ``old_flag`` (kept as a hidden
    alias so scripts keep working); both with different values is an error."""
    if old_value is None:
        return value
    if value is not None and value != old_value:
        raise InputError(f"{old_flag} is the old spelling of {flag}; give one of them")
    return old_value


def required(value: T | None, flag: str) -> T:
    """``value``, or an error naming the missing ``flag``."""
    if value is None:
        raise InputError(f"missing option {flag}")
    return value
