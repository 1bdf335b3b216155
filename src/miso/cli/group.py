"""The Typer group class of every ``miso`` command group: help that starts fast, in plain text.

Typer coerces an option's value through pydantic when it is not already of its type; a group's
``--help`` flag that was not given has the value None, so ``miso status --help`` imported
pydantic (~0.15 s here) just to read the root group's unused ``--help``. With its default
False, the unused flag is a bool and passes through: ``miso X --help`` imports no pydantic.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup


class QuickHelpGroup(TyperGroup):
    """A :class:`TyperGroup` whose ``--help`` flag defaults to False (see the module docstring)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The subcommand, its help in plain text: docstrings' reST ````x```` reads as `x`."""
        cmd = super().get_command(ctx, cmd_name)
        for attr in ("help", "short_help"):
            v = getattr(cmd, attr, None)
            if isinstance(v, str) and "``" in v:
                setattr(cmd, attr, v.replace("``", "`"))
        return cmd

    def get_params(self, ctx: Any) -> list[Any]:
        """As :meth:`get_help_option`: Typer's ``--install-completion``/``--show-completion``
        flags default to None; given a False default they skip pydantic too."""
        params = super().get_params(ctx)
        for p in params:
            if p.name in ("install_completion", "show_completion") and p.default is None:
                p.default = False
        return params

    def get_help_option(self, ctx: Any) -> Any:
        opt = super().get_help_option(ctx)
        if opt is not None and opt.default is None:
            opt.default = False
        return opt
