"""The Policy protocol, the speed-estimator protocol and the name -> factory registry."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from miso.mig import Geometry
from miso.sched.decisions import Decision
from miso.sched.events import Event
from miso.sched.state import ClusterState, JobState

SpeedTable = dict[str, dict[str, float]]
"""job id -> {profile name -> speed relative to the full GPU}; a missing profile = does not fit."""


@runtime_checkable
class SpeedEstimator(Protocol):
    """Where policies get per-profile speeds from (no I/O, deterministic for a seed).

    ``profile`` is the raw MPS profile of the mix the jobs were profiled in (job -> rates at
    100/50/14 %), or None when no profile is available (oracle-style estimators ignore it).
    """

    needs_profile: bool

    def estimate(self, geom: Geometry, jobs: Sequence[JobState],
                 profile: Mapping[str, tuple[float, ...]] | None = None) -> SpeedTable: ...


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: events in, decisions out.

    ``decide`` is called once per event, after the driver has updated ``state`` with it. It may
    read ``state`` freely, draw plan ids with ``state.new_plan_id()``, and keep private caches,
    but must not change ``state`` otherwise and must not do I/O.
    """

    name: str

    def decide(self, now: float, event: Event, state: ClusterState) -> list[Decision]: ...


PolicyFactory = Callable[..., Policy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Class/function decorator adding a policy factory under ``name``."""

    def deco(f: PolicyFactory) -> PolicyFactory:
        _REGISTRY[name] = f
        return f

    return deco


def policy_names() -> list[str]:
    """Registered policy names."""
    _load_builtin()
    return list(_REGISTRY)


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Build a registered policy (kwargs go to its factory, e.g. ``estimator=``)."""
    _load_builtin()
    try:
        f = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(_REGISTRY)}") from None
    return f(**kwargs)


def build_policy(name: str, **options: Any) -> Policy:
    """Like :func:`make_policy`, but drop the options the policy's factory does not take.

    For drivers (the live controller) that pass one set of knobs to whatever policy is named.
    """
    _load_builtin()
    f = _REGISTRY.get(name)
    if f is not None:
        try:
            params = inspect.signature(f).parameters
        except (TypeError, ValueError):
            params = None
        if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            options = {k: v for k, v in options.items() if k in params}
    return make_policy(name, **options)


def _load_builtin() -> None:
    import miso.sched.policies  # noqa: F401  (registers the built-in policies)
