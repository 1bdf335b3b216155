"""The estimate point of miso+'s learners: plugins that change the speeds a plan uses or what an
observed rate teaches. The shipped profile has none; issue 19's experiments
(:mod:`miso.sched.experiments`) are plugins here that a benchmark puts into a profile
(``make_policy("miso+", estimates=(MemoryPrior(),))``).

A plugin is a frozen record of its options; :meth:`SpeedPlugin.build` gives the instance one
policy uses (a plugin with memory builds a fresh one). Every hook has a default that changes
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from miso.mig import Geometry

if TYPE_CHECKING:  # pragma: no cover
    from miso.sched.events import SpeedObserved
    from miso.sched.policies.base import Scratch
    from miso.sched.policies.misoplus import MisoPlus


class SpeedPlugin:
    """No-op hooks (see the module docstring)."""

    name: ClassVar[str] = "speed"

    def build(self) -> SpeedPlugin:
        """The instance one policy uses (its memory, if any, starts empty)."""
        return self

    def known(self, pol: MisoPlus, sc: Scratch, job: str, est: dict[str, float],
              speeds: dict[str, float]) -> dict[str, float]:
        """The speeds to plan ``job`` with, given its estimate ``est`` (``speeds``: what the
        plugins before this one made of it)."""
        return speeds

    def prior(self, pol: MisoPlus, sc: Scratch, geom: Geometry, job: str,
              speeds: dict[str, float], batch: bool) -> dict[str, float]:
        """The speeds to plan a job without an estimate with (``speeds``: the catalogue
        prior, harmonic in a fixed mix ``batch``, after the plugins before this one)."""
        return speeds

    def rate(self, pol: MisoPlus, sc: Scratch, ev: SpeedObserved, full: str) -> None:
        """``ev`` is a measured rate (on the whole GPU ``full``: the job's reference rate is
        set), before the job's reference rate is read."""

    def corrected(self, pol: MisoPlus, sc: Scratch, job: str, geom: Geometry, full: str,
                  before: dict[str, float]) -> None:
        """``job``'s estimates (``before``) were replaced by its observed rates."""

    def forget(self, job: str) -> None:
        """``job`` ended."""
