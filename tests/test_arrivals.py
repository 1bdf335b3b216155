"""The arrival window (:class:`miso.sched.policies.arrivals.ArrivalClock`): the mean gap, when
arrivals count as stopped, the median newcomer's memory, the offered load (Little's law)."""

from __future__ import annotations

import pytest

from miso.sched.policies.arrivals import ArrivalClock


def test_no_rate_before_two_distinct_arrivals_and_quiet_then() -> None:
    c = ArrivalClock(quiet_gaps=2.0)
    assert c.gap is None and c.quiet(0.0) and c.quiet_from() is None
    c.note(10.0, 4.0)
    c.note(10.0, 8.0)  # one instant: still no rate (a fixed mix)
    assert c.gap is None and c.quiet(11.0)
    assert c.median_memory() == 8.0


def test_mean_gap_over_the_window_and_quiet_after_gaps() -> None:
    c = ArrivalClock(quiet_gaps=2.0, window=3)
    for t in (0.0, 100.0, 110.0, 130.0):  # the window keeps the last three
        c.note(t, 1.0)
    assert c.gap == pytest.approx(15.0)
    assert not c.quiet(130.0 + 30.0) and c.quiet(130.0 + 30.1)
    at = c.quiet_from()
    assert at is not None and c.quiet(at) and not c.quiet(at - 0.5)


def test_offered_load_counts_undeclared_work_at_the_default() -> None:
    c = ArrivalClock(quiet_gaps=8.0, window=4, load_window=4)
    for i, w in enumerate((100.0, None, 300.0, None, 500.0)):  # the first falls out
        c.note(i * 10.0, 1.0, w)
    assert c.offered_load(200.0, min_samples=5) is None  # fewer samples in the window
    # works 200 (default), 300, 200, 500 over a mean gap of 10 s: 30 GPUs busy, at least
    # 30 x (1 - 1/sqrt(4)) from 4 arrivals
    assert c.offered_load(200.0, min_samples=4) == pytest.approx(15.0)
