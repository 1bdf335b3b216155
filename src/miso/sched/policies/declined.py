"""miso+'s declined repartitions, as decision records (issue 33): when the restart economy
keeps a GPU's layout although another would run its jobs faster, or a queued job waits for a
whole GPU rather than share one (which would restart its residents), the policy says so with
a :class:`~miso.sched.decisions.RepartitionDeclined`: the gain it gave up and the restart
price that outweighed it. Nothing depends on these records; they only explain.

Two hooks call it: :meth:`MisoPlus.solve_and_apply` when the priced plan keeps the layout
(:func:`declined_plan`), and :meth:`Admission.better_to_wait` when a job waits for a whole GPU
(:func:`declined_share`, with the figures of its estimate). A decline repeated unchanged (same
GPU, same layouts, same jobs) is recorded once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from miso.mig import Placement
from miso.optimize import optimizer_for
from miso.sched.decisions import RepartitionDeclined
from miso.sched.policies.base import Scratch

Speeds = Mapping[str, Mapping[str, float]]

#: Declines remembered at most (GPUs and waiting jobs, the most recent kept).
KEPT = 4096

#: A gain below this (total speed) is a tie, not a repartition given up.
MIN_GAIN = 1e-6


def is_new(last: dict[str, tuple[Any, ...]], key: str, what: tuple[Any, ...]) -> bool:
    """True (and remembered in ``last``, the policy's ``declines``: the last decline recorded
    per GPU and per waiting job, so what repeats is not recorded again) when ``what`` differs
    from the last decline under ``key``."""
    if last.get(key) == what:
        return False
    last.pop(key, None)
    last[key] = what
    if len(last) > KEPT:
        del last[next(iter(last))]  # the oldest: ended jobs are not kept
    return True


def declined_plan(policy: Any, sc: Scratch, g: str, speeds: Speeds,
                  current: Mapping[str, Placement], pinned: set[str],
                  prices: tuple[float | None, Mapping[str, float]],
                  reserved: str | None) -> None:
    """``g`` keeps its layout under the restart-aware objective: when the plain objective
    (throughput, restarts not priced) would have moved running jobs for a higher total
    speed, record the gain and the restarts' price in ``sc.out``. ``prices``: the plan's
    (horizon, restart price per running job) (:meth:`RestartEconomy.prices`: total
    speed over the horizon, the unit the plan was chosen in); ``reserved``: the instances the
    kept layout holds free for the next arrival (:meth:`MisoPlus.keep_room`), else None."""
    horizon, penalty = prices  # (a kept layout has running jobs: it is priced)
    gs = sc.state.gpus[g]
    # (No OptimizerError: the priced plan was solved for the same jobs, instances and pinned
    # jobs, and whether a layout holds them does not depend on the objective.)
    alt = optimizer_for(gs.geom).solve(speeds, current=dict(current),
                                       objective=policy.objective, pinned=pinned)
    cur = sum(speeds[j][pl.profile] for j, pl in current.items() if pl.profile in speeds[j])
    moved = tuple(alt.restarted)
    gain = alt.throughput - cur
    if gain <= MIN_GAIN or not moved or not is_new(policy.declines, g, (
            tuple(sorted(gs.layout)), tuple(sorted(alt.layout)), moved, reserved)):
        return
    priced = {j: penalty.get(j, 0.0) for j in moved}
    costs = {j: policy.restarts.cost(j) for j in moved}
    price = sum(priced.values())
    # In words: the speed it would have won, each restart's cost (s), their price over the
    # horizon, and what outweighed the gain.
    verdict = "the restarts outweigh the gain" if price >= gain - MIN_GAIN else \
        "the restart-aware plan keeps it"
    if reserved:
        verdict += f"; {reserved} stays free for the next arrival, expected within the horizon"
    names = ", ".join(f"{j} ({c:.3g} s)" for j, c in costs.items())
    sc.out.append(RepartitionDeclined(
        g, moved, gain, price,
        why={"trigger": sc.cycle.trigger, "unit": "speed", "horizon_s": horizon,
             "throughput": alt.throughput, "current_objective": cur,
             "layout": [str(p) for p in sorted(alt.layout)],
             "assignment": {j: str(p) for j, p in alt.assignment.items()},
             "restart_costs": costs, "restart_prices": priced, "reserved": reserved,
             "note": f"{g}: kept its layout: a repartition would raise its total speed "
                     f"{cur:.2f} -> {alt.throughput:.2f} (gain {gain:.3f}) but restart "
                     f"{names}, priced at {price:.3f} over a {horizon:.0f} s horizon: "
                     f"{verdict}"}))


def declined_share(policy: Any, sc: Scratch, g: str, job: str, share: float, wait: float,
                   bias: float, restarts: list[str]) -> None:
    """``job`` waits for a whole GPU rather than share ``g``: record the completion time
    sharing would save before its restarts (``gain``, s, summed over ``g``'s jobs and the
    newcomer) and what the restarts of ``g``'s running jobs cost (``price``, s), from the
    estimate :meth:`Admission.better_to_wait` just made: the sums of completion times sharing
    and waiting (``share``, ``wait``, s), the ``bias`` it waited with, the running residents
    sharing would restart."""
    moved = tuple(restarts)
    price = sum(policy.restarts.cost(r) for r in moved)
    gain = wait - (share - price)
    if not is_new(policy.declines, "job:" + job, (g, tuple(sc.jobs_on(g)), moved)):
        return
    if gain > 0 and moved:
        why_not = (f"sharing would end the jobs {gain:.0f} s sooner in total, but restarting "
                   f"{', '.join(moved)} costs {price:.0f} s")
    else:
        why_not = "sharing would not end the jobs sooner, even without restarts"
    note = (f"job {job} waits for a whole GPU rather than share {g}: {why_not} "
            f"(estimated total completion time sharing {share:.0f} s vs waiting {wait:.0f} s)")
    sc.out.append(RepartitionDeclined(
        g, moved, gain, price, job,
        why={"trigger": sc.cycle.trigger, "unit": "s", "share_s": share, "wait_s": wait,
             "bias": bias, "note": note}))
