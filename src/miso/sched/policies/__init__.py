"""The built-in policies and the policy table: name -> class, written out (no registration as
an import side effect), with explicit options.

:func:`make_policy` builds a policy from its options; an option the policy does not take, or
a required one left out (MISO's ``estimator``), is an error naming it.
:func:`build_policy` is for drivers that hand one set of knobs to whatever policy is named
(the live controller): its ``defaults`` go only to policies that take them, its ``options``
(the user's) must all be taken.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from miso.sched.policies.baselines import MpsOnly, NoPart, OptSta
from miso.sched.policies.framework import Profile, profile_of
from miso.sched.policies.miso import Miso, Oracle, oracle
from miso.sched.policies.misoplus import MisoPlus
from miso.sched.policy import Policy

PolicyFactory = Callable[..., Policy]

#: The shipped profiles (:mod:`~miso.sched.policies.framework`): each policy class with its
#: plugins. A variant is ``PROFILES[name].plus(filters=(MyFilter(...),))``.
PROFILES: dict[str, Profile] = {p.name: p for p in (
    profile_of(NoPart), profile_of(OptSta), profile_of(MpsOnly), profile_of(Oracle),
    profile_of(Miso), profile_of(MisoPlus))}

#: The policy table: name -> profile (or any factory with the
#: :class:`~miso.sched.policy.Policy` protocol: a class with ``name`` and ``decide``).
POLICIES: dict[str, PolicyFactory] = dict(PROFILES)


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Add a (third-party) policy factory to the table under ``name``; explicit, at the
    caller's import: built-in policies are listed in :data:`POLICIES`."""

    def deco(f: PolicyFactory) -> PolicyFactory:
        POLICIES[name] = f
        return f

    return deco


def policy_names() -> list[str]:
    """Names in the policy table."""
    return list(POLICIES)


def _factory(name: str) -> PolicyFactory:
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


def policy_options(name: str) -> dict[str, inspect.Parameter]:
    """The options policy ``name`` takes (a subclass's ``**options`` forwarded to its base
    class adds the base's)."""
    f = _factory(name)
    if isinstance(f, Profile):
        f = f.policy
    out: dict[str, inspect.Parameter] = {}
    targets = [c.__init__ for c in f.__mro__ if "__init__" in vars(c)] \
        if isinstance(f, type) else [f]
    for fn in targets:
        params = list(inspect.signature(fn).parameters.values())
        for p in params:
            if p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            out.setdefault(p.name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    if f is Oracle:
        out.pop("estimator", None)
    return out


def make_policy(name: str, **options: Any) -> Policy:
    """Build policy ``name`` with ``options``; an unknown or missing option is a
    ``TypeError`` naming it and the policy."""
    f = _factory(name)
    known = policy_options(name)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"policy {name!r} has no option {', '.join(map(repr, unknown))}; "
                        f"its options: {', '.join(known) or 'none'}")
    missing = [k for k, p in known.items() if p.default is p.empty and k not in options]
    if missing:
        raise TypeError(f"policy {name!r} needs {', '.join(map(repr, missing))}"
                        + (" (miso.sched.make_estimator builds one)"
                           if "estimator" in missing else ""))
    return f(**options)


def build_policy(name: str, defaults: Mapping[str, Any] | None = None,
                 **options: Any) -> Policy:
    """:func:`make_policy` with a driver's ``defaults`` given only to a policy that takes
    them (the live controller's estimator and profiling knobs); ``options`` are strict."""
    known = policy_options(name)
    merged = {k: v for k, v in (defaults or {}).items() if k in known}
    merged.update(options)
    return make_policy(name, **merged)


__all__ = ["POLICIES", "PROFILES", "Miso", "MisoPlus", "MpsOnly", "NoPart", "OptSta", "Oracle",
           "Profile", "build_policy", "make_policy", "oracle", "policy_names", "policy_options",
           "register"]
