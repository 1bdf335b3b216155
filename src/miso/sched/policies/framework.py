"""The policy framework: named extension points a policy is assembled from, after the
Kubernetes scheduler framework (``framework/interface.go``: plugins at named points;
``cycle_state.go``: the facts of one scheduling cycle) and Slurm's split of priority (order),
backfill (when) and select (where) with one fit test for placement and preemption alike.

One ``decide`` call is one **cycle**. Its facts are computed once, at its top, into a
:class:`Cycle` (the time, the event, the trigger named in explanations, the state, the call's
:class:`~miso.sched.policies.base.Scratch`, and the filters active in it); plugins read the
cycle, never fields a previous call left on the policy.

The extension points, in the order a cycle runs them:

======================  ==================================================================
point                   what it answers; where it lives
======================  ==================================================================
learners                what the events so far teach (observed speeds, restart costs,
                        arrival rates): miso+'s ``decide`` top (``ArrivalClock``,
                        ``RestartCosts.learn``, observed.py's speed events)
post-filter ``before``  room taken back before the queue is placed: :class:`Reclaim`
queue order             which queued job first: ``Scratch.queue`` (FIFO, or tenancy's
                        priority / fair-share order)
filter                  a job on a GPU beside given residents: allowed, or why not
                        (:class:`Filter`; :class:`Entitlement`)
score                   which allowed GPU: the policy's occupancy index (least crowded,
                        then GPU order)
permit                  go now or wait (miso+'s ``better_to_wait``, ``batch_full``)
reserve                 room kept for expected work (miso+'s ``headroom``)
plan                    the per-GPU layout and assignment (the optimizer): the policy's
                        event hooks (``on_capacity``, ``replan``)
post-filter ``after``   what to undo when the queue's head still waits: :class:`Preempt`
======================  ==================================================================

**The fit test** (:meth:`~miso.sched.policies.base.BasePolicy.fits`) is the policy's
capacity test (``capacity_fit``: a valid layout, a static slot, an MPS share, a whole GPU)
and then every active filter of its profile. Preemption and reclaim call it on a forked view
(the residents that would stay); NoPart's and the MISO family's placement call the same
filters on each candidate GPU.

**A profile** (:class:`Profile`) is a policy: the class carrying its plan stage, and the
filter and post-filter plugins (each a frozen record of its own options). The policy table
(:data:`miso.sched.policies.POLICIES`) holds profiles. A new placement rule is one
:class:`Filter` class plus one line in a profile (``PROFILES["miso+"].plus(filters=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from inspect import Parameter, Signature
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from miso.sched.events import Event
from miso.sched.policies.explain import TRIGGERS
from miso.sched.policies.preempt import preempt
from miso.sched.policies.reclaim import reclaim

if TYPE_CHECKING:  # pragma: no cover
    from miso.mig import Geometry
    from miso.sched.policies.base import BasePolicy, Scratch
    from miso.sched.policy import Policy
    from miso.sched.state import ClusterState


class Cycle:
    """The facts of one ``decide`` call, computed once at its top (Kubernetes' CycleState).
    ``memo``: answers plugins computed once in this cycle. ``filters``: the profile's filters
    active in this cycle (a filter that cannot reject
    anything now is left out, so the placement indexes keep their fast paths)."""

    __slots__ = ("event", "filters", "memo", "now", "owner_bound", "sc", "state", "trigger")

    def __init__(self, now: float, event: Event, state: ClusterState, sc: Scratch,
                 filters: Sequence[Filter]) -> None:
        self.now = now
        self.event = event
        self.state = state
        self.sc = sc
        self.trigger = TRIGGERS.get(type(event).__name__, type(event).__name__)
        #: owners' entitlements restrict which GPU a job may join in this cycle
        self.owner_bound = sc.owner_bound()
        self.filters: tuple[Filter, ...] = ()
        self.filters = tuple(f for f in filters if f.active(self))
        #: what plugins computed once in this cycle (a scan, a stateful test's answer with the
        #: inputs it was computed from), by name: kept here, not on the plugin
        self.memo: dict[str, Any] = {}

    def allowed(self, job: str, gpu: str, residents: Sequence[str]) -> bool:
        """Every active filter lets ``job`` join ``residents`` on ``gpu``."""
        return all(f.reject(self, job, gpu, residents) is None for f in self.filters)

    def why_not(self, job: str, gpu: str, residents: Sequence[str]) -> str | None:
        """The first active filter's reason against ``job`` on ``gpu``, or None."""
        for f in self.filters:
            why = f.reject(self, job, gpu, residents)
            if why is not None:
                return why
        return None


class Filter(Protocol):
    """Filter point: ``job`` on ``gpu`` beside ``residents`` (the jobs that would stay):
    None when allowed, else why not (words). Pure; a frozen record of its options."""

    name: ClassVar[str]

    def active(self, cy: Cycle) -> bool:
        """Whether the filter can reject anything in this cycle."""
        ...

    def reject(self, cy: Cycle, job: str, gpu: str, residents: Sequence[str]) -> str | None:
        ...


class FairSliceFloor(Protocol):
    """A fair-slice plugin of :class:`Entitlement`: the sizes a protected job of
    ``memory_gb`` and ``workload`` is owed on ``geom``, raised from ``owed`` (miso+'s:
    :mod:`miso.sched.fairspeed`)."""

    def owed(self, geom: Geometry, owed: frozenset[str], memory_gb: float,
             workload: str | None) -> frozenset[str]: ...


class PostFilter(Protocol):
    """Post-filter point: decisions that free room, run ``when`` ``"before"`` the event's
    placement or ``"after"`` it; ``run`` returns True when it freed room (the framework then
    has the policy place the queue again, ``before`` only: ``after`` plugins place it
    themselves). They test fit with the policy's :meth:`fits` on a forked view."""

    name: ClassVar[str]
    when: ClassVar[str]

    def active(self, policy: BasePolicy, cy: Cycle) -> bool: ...

    def run(self, policy: BasePolicy, cy: Cycle) -> bool: ...


# -- built-in plugins ------------------------------------------------------------------------
@dataclass(frozen=True)
class Entitlement:
    """Fair share's filter (tenancy on with entitlements): a GPU reclaimed in this cycle takes
    only jobs of the owner it was returned to, and a job joins only where every protected job
    (its own included) keeps its fair slice (:mod:`~miso.sched.policies.entitled`).
    ``floors``: fair-slice plugins that raise the sizes a protected job is owed, with a stated
    price (:class:`FairSliceFloor`; miso+'s speed floor:
    :mod:`miso.sched.fairspeed`)."""

    floors: tuple[FairSliceFloor, ...] = ()
    name: ClassVar[str] = "entitlement"

    def active(self, cy: Cycle) -> bool:
        return cy.owner_bound

    def reject(self, cy: Cycle, job: str, gpu: str, residents: Sequence[str]) -> str | None:
        sc = cy.sc
        owner = cy.state.jobs[job].spec.owner
        got = sc.reserved.get(gpu, owner)
        if got != owner:
            return f"{gpu} is returned to owner {got or '(none)'} in this call"
        if not sc.fair.mix(gpu, [*residents, job]):
            return f"on {gpu} a protected job would lose its fair slice"
        return None


@dataclass(frozen=True)
class Reclaim:
    """Fair share's reclaim (:mod:`~miso.sched.policies.reclaim`), before placement; on with
    ``TenancyConfig`` entitlements (fair share and reclaim)."""

    name: ClassVar[str] = "reclaim"
    when: ClassVar[str] = "before"

    def active(self, policy: BasePolicy, cy: Cycle) -> bool:
        ten = cy.state.tenancy
        return ten is not None and ten.config.entitled

    def run(self, policy: BasePolicy, cy: Cycle) -> bool:
        return reclaim(policy, cy.now, cy.sc)


@dataclass(frozen=True)
class Preempt:
    """Priority preemption (:mod:`~miso.sched.policies.preempt`), after placement; on with
    ``TenancyConfig(preempt=True)``."""

    name: ClassVar[str] = "preempt"
    when: ClassVar[str] = "after"

    def active(self, policy: BasePolicy, cy: Cycle) -> bool:
        ten = cy.state.tenancy
        return ten is not None and ten.config.preempt

    def run(self, policy: BasePolicy, cy: Cycle) -> bool:
        preempt(policy, cy.now, cy.sc)
        return False


ENTITLEMENT = Entitlement()
RECLAIM = Reclaim()
PREEMPT = Preempt()


@dataclass(frozen=True)
class Profile:
    """A policy as a profile: ``policy``, the class whose event hooks are its plan stage (and
    whose ``capacity_fit`` is the fit test's capacity part), its ``filters`` and
    ``post_filters`` (frozen plugin records, run in order), and ``options`` given to the class
    unless the caller gives them. Calling a profile builds the policy."""

    name: str
    policy: type[BasePolicy]
    filters: tuple[Filter, ...] = ()
    post_filters: tuple[PostFilter, ...] = (PREEMPT,)
    options: Mapping[str, Any] = field(default_factory=dict)

    def plus(self, *, name: str | None = None, filters: Sequence[Filter] = (),
             post_filters: Sequence[PostFilter] = ()) -> Profile:
        """This profile with more plugins (after its own)."""
        return replace(self, name=name or self.name, filters=(*self.filters, *filters),
                       post_filters=(*self.post_filters, *post_filters))

    def __call__(self, **options: Any) -> Policy:
        pol = self.policy(**{**self.options, **options})
        pol.profile = self
        pol.filters = self.filters
        pol.post_filters = self.post_filters
        return pol


def take_options(records: Sequence[type], options: dict[str, Any]) -> dict[type, Any]:
    """A policy made of stages, each with its own frozen options record: each record built
    from the ``options`` named by its fields (a name may feed several records); those are
    taken out of ``options``, the rest stay for the policy's base class."""
    names = {f.name for r in records for f in fields(r)}
    mine = {k: options.pop(k) for k in list(options) if k in names}
    return {r: r(**{f.name: mine[f.name] for f in fields(r) if f.name in mine})
            for r in records}


def records_signature(records: Sequence[type], rest: str) -> Signature:
    """The ``__init__`` signature of a policy whose options are its ``records``' fields
    (keyword-only, with their defaults), then ``**rest`` (its base class's): what
    :func:`~miso.sched.policies.policy_options` reads (``cls.__init__.__signature__``)."""
    return Signature([Parameter("self", Parameter.POSITIONAL_OR_KEYWORD), *{
        f.name: Parameter(f.name, Parameter.KEYWORD_ONLY, default=f.default)
        for r in records for f in fields(r)}.values(), Parameter(rest, Parameter.VAR_KEYWORD)])


def profile_of(policy: type[BasePolicy], name: str | None = None) -> Profile:
    """The profile of a policy class with its own plugins (its class defaults)."""
    return Profile(name or policy.name, policy, tuple(policy.filters),
                   tuple(policy.post_filters))


PolicyFactory = Callable[..., "Policy"]
