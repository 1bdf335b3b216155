"""When a running job's report is news for the loop (the poller sends progress that moved)."""

from miso.controller.poller import PROGRESS_DRIFT_S, PROGRESS_REFRESH_S, progress_moved


def test_first_report_is_sent() -> None:
    assert progress_moved(None, 100.0, 10.0, 5.0)


def test_a_job_at_the_rate_it_reported_is_not_resent_until_the_refresh() -> None:
    posted = (0.0, 1000.0, 10.0)
    for t in (1.0, 2.0, 5.0):  # 10 it/s as predicted, one iteration of rounding either way
        assert not progress_moved(posted, 1000.0 - 10.0 * t + 1.0, 10.0, t)
        assert not progress_moved(posted, 1000.0 - 10.0 * t - 1.0, 11.0, t)
    assert progress_moved(posted, 1000.0 - 10.0 * PROGRESS_REFRESH_S, 10.0, PROGRESS_REFRESH_S)


def test_a_job_that_slowed_down_is_sent_once_its_estimate_drifts() -> None:
    posted = (0.0, 1000.0, 10.0)
    half = [t for t in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
            if progress_moved(posted, 1000.0 - 5.0 * t, 5.0, t)]  # at half the rate
    assert half and half[0] > PROGRESS_DRIFT_S and half[0] <= 2 * PROGRESS_DRIFT_S + 0.5
