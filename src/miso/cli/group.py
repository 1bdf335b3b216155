"""The Typer group class of every ``miso`` command group: help that starts fast.

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

    def get_help_option(self, ctx: Any) -> Any:
        opt = super().get_help_option(ctx)
        if opt is not None and opt.default is None:
            opt.default = False
        return opt
