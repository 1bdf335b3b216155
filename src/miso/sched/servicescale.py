"""The scaling steps of :class:`~miso.sched.serviceplan.ServicePlanner` (its base
:class:`ScalingSteps`): one planning step per service event, scale out by the cheapest
covering of the shortfall or a make-before-break resize, scale in with hysteresis, drain the
retiring replicas the ready ones no longer need (the rules: :mod:`miso.sched.serviceplan`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from miso.sched import servicerate
from miso.sched.services import DrainReplica, ServiceSpec, StartReplica

if TYPE_CHECKING:
    from miso.sched.serviceplan import PlannerConfig, ReplicaState, ServiceState
    from miso.sched.servicerate import PlanRate


class ScalingSteps:
    """Scale-out, scale-in and draining of one service; reads the planner's knobs
    (``cfg``), its rate signal (``rates``, ``target``), coverings (``cheapest``,
    ``options``) and places replicas with ``start_for``."""

    cfg: PlannerConfig

    if TYPE_CHECKING:
        def rates(self, s: ServiceState) -> PlanRate: ...
        def target(self, s: ServiceState) -> float: ...
        def options(self, spec: ServiceSpec) -> list[tuple[str, float, int]]: ...
        def cheapest(self, spec: ServiceSpec, need: float, at_least: int, at_most: int
                     ) -> list[str] | None: ...
        def start_for(self, now: float, s: ServiceState, profile: str, why: dict
                   ) -> StartReplica | None: ...

    def _why(self, s: ServiceState, trigger: str, **kw: object) -> dict:
        p = self.rates(s)
        return dict(trigger=trigger, service=s.spec.name, rate_rps=round(s.last, 2),
                    smoothed_rps=round(s.ewma, 2), trend_rps_per_s=round(p.slope, 4),
                    target_rps=round(servicerate.target(p, s.spec.headroom), 2),
                    slo_ms=s.spec.slo_p99_ms, percentile=s.spec.percentile, **kw)

    def _plan(self, now: float, s: ServiceState, trigger: str
              ) -> list[StartReplica | DrainReplica]:
        """One planning step: scale out when short of the target, else consider scaling in;
        then drain the retiring replicas the ready ones no longer need."""
        target = self.target(s)
        covered = self._take_back_retiring(s, target)
        if self._short(s, target, covered):
            out = self._scale_out(now, s, target, covered, trigger)
        else:
            out = self._consider_scale_in(now, s, target, covered, trigger)
        out += self._drain_retired(now, s, trigger)
        return out

    @staticmethod
    def _short(s: ServiceState, target: float, covered: float) -> bool:
        """The live replicas fall short of the target rate or of ``min_replicas``."""
        return covered + 1e-9 < target or len(s.live()) < s.spec.min_replicas

    def _take_back_retiring(self, s: ServiceState, target: float) -> float:
        """The covering: what the live replicas cover. When short, retiring (not yet
        draining) replicas count again first (they need no load time) and any pending
        scale-in is called off."""
        covered = s.covered()
        if self._short(s, target, covered):
            s.over_since = None
            for r in s.replicas.values():
                if r.retiring and not r.draining and covered + 1e-9 < target:
                    r.retiring = False
                    covered += r.capacity
        return covered

    def _profiles_to_add(self, spec: ServiceSpec, need: float, n_live: int) -> list[str]:
        """Scale-out's profiles: the cheapest covering of ``need`` within the replica bounds,
        or, if none covers it within ``max_replicas``, the biggest allowed."""
        add = self.cheapest(spec, need, max(0, spec.min_replicas - n_live),
                            spec.max_replicas - n_live)
        if add is None:
            opts = self.options(spec)
            add = [max(opts, key=lambda o: o[1])[0]] * max(
                0, spec.max_replicas - n_live) if opts else []
        return add

    def _scale_out(self, now: float, s: ServiceState, target: float, covered: float,
                   trigger: str) -> list[StartReplica | DrainReplica]:
        """Scale-out: start the replicas that cover the shortfall, or, when the cheapest
        covering of the whole target takes fewer compute slices than the live replicas plus
        that top-up, resize to it make-before-break (replicas grown piecemeal, 7g + 4 x 3g,
        become 2 x 7g); starts the cooldown."""
        spec = s.spec
        live = s.live()
        add = self._profiles_to_add(spec, target - covered, len(live))
        if covered + 1e-9 < target and len(live) >= spec.min_replicas:
            whole = self.cheapest(spec, target, spec.min_replicas, spec.max_replicas)
            have = [r.slot.profile for r in live]
            if whole is not None and self._slices(spec, whole) < self._slices(spec, have + add):
                out = self._resize_to(now, s, whole, covered, trigger, "scale_out", (
                    f"scale out {spec.name}: target {target:.1f}/s > covered {covered:.1f}/s; "
                    f"resize to {'+'.join(whole)} (fewer slices than adding "
                    f"{'+'.join(add)}), new replicas before draining"))
                if out:
                    s.last_out = now
                    return out
                for r in live:  # no room for the resize: top up the replicas as they are
                    r.retiring = False
        out: list[StartReplica | DrainReplica] = []
        for prof in add:
            d = self.start_for(now, s, prof, self._why(
                s, trigger, action="scale_out", covered_rps=round(covered, 2),
                note=(f"scale out {spec.name}: target {target:.1f}/s > covered "
                      f"{covered:.1f}/s; add {prof}" if covered + 1e-9 < target else
                      f"start {spec.name}: {len(s.live())} live < min_replicas "
                      f"{spec.min_replicas}; add {prof}")))
            if d is not None:
                out.append(d)
                covered += s.replicas[d.replica].capacity
        if out:
            s.last_out = now
        return out

    def _consider_scale_in(self, now: float, s: ServiceState, target: float, covered: float,
                           trigger: str) -> list[StartReplica | DrainReplica]:
        """Scale-in with hysteresis: resize only after the service has been oversized
        (past the cooldown) for ``scale_in_delay_s`` without a break."""
        if now - s.last_out >= self.cfg.cooldown_s and self._oversized(s, target):
            if s.over_since is None:
                s.over_since = now
            elif now - s.over_since >= self.cfg.scale_in_delay_s:
                return self._scale_in(now, s, target, covered, trigger)
            return []
        s.over_since = None
        return []

    def _slices(self, spec: ServiceSpec, profiles: Sequence[str]) -> int:
        g_of = {p: g for p, _, g in self.options(spec)}
        return sum(g_of.get(p, 99) for p in profiles)

    def _oversized(self, s: ServiceState, target: float) -> bool:
        """The cheapest covering of target x (1 + hysteresis) takes fewer compute slices than
        the live replicas: a resize would save slices and still leave the margin."""
        spec = s.spec
        want = self.cheapest(spec, target * (1.0 + self.cfg.hysteresis), spec.min_replicas,
                             spec.max_replicas)
        if want is None:
            return False
        return self._slices(spec, want) < self._slices(spec, [r.slot.profile for r in s.live()])

    def _scale_in(self, now: float, s: ServiceState, target: float, covered: float,
                  trigger: str) -> list[StartReplica | DrainReplica]:
        spec = s.spec
        live = s.live()
        want = self.cheapest(spec, target * (1.0 + self.cfg.hysteresis), spec.min_replicas,
                             spec.max_replicas)
        if want is None or self._slices(spec, want) >= self._slices(
                spec, [r.slot.profile for r in live]):
            return []
        out = self._resize_to(now, s, want, covered, trigger, "resize", (
            f"resize {spec.name}: {covered:.1f}/s covered > target {target:.1f}/s x "
            f"{1 + self.cfg.hysteresis:g} for {self.cfg.scale_in_delay_s:g}s; start "
            f"{'+'.join(want)} before draining"))
        s.over_since = None
        return out

    def _resize_to(self, now: float, s: ServiceState, want: list[str], covered: float,
                   trigger: str, action: str, note: str) -> list[StartReplica | DrainReplica]:
        """Make-before-break resize to the covering ``want``: the live replicas it also uses
        stay (largest capacity first), the others retire (drained once the ready replicas
        cover the target: :meth:`_drain_retired`), its missing replicas start."""
        live = s.live()
        keep: list[ReplicaState] = []
        rest = list(want)
        for r in sorted(live, key=lambda r: -r.capacity):
            if r.slot.profile in rest:
                rest.remove(r.slot.profile)
                keep.append(r)
        if len(want) >= 2 and not rest and len({r.gpu for r in keep}) < 2:
            moved = keep.pop()  # keep the spread: its twin starts on another GPU
            rest.append(moved.slot.profile)
        out: list[StartReplica | DrainReplica] = []
        for r in live:
            if r not in keep:
                r.retiring = True
        for prof in rest:
            d = self.start_for(now, s, prof, self._why(
                s, trigger, action=action, covered_rps=round(covered, 2), note=note))
            if d is not None:
                out.append(d)
        return out

    def _drain_retired(self, now: float, s: ServiceState, trigger: str) -> list[DrainReplica]:
        """Drain retiring replicas once the ready live ones cover the target (make-before-break);
        if a retiring replica's replacement could not be placed, it is kept."""
        retiring = [r for r in s.replicas.values() if r.retiring and not r.draining]
        if not retiring:
            return []
        target = self.target(s)
        ready = sum(r.capacity for r in s.live() if r.ready)
        if ready + 1e-9 < target or len([r for r in s.live() if r.ready]) < s.spec.min_replicas:
            if s.covered() + 1e-9 < target:  # replacement could not be placed: keep them
                for r in retiring:
                    r.retiring = False
            return []
        out = []
        for r in retiring:
            r.draining = True
            out.append(DrainReplica(s.spec.name, r.id, why=self._why(
                s, trigger, action="drain", covered_rps=round(ready, 2),
                note=(f"drain {r.id} ({r.slot.profile} on {r.gpu}): ready replicas cover "
                      f"{ready:.1f}/s >= target {target:.1f}/s"))))
        return out
