"""The core's RateMeter: the rate the TUI's job rows show, over a sliding window."""

from ckpt_tui.core.progress import Progress, RateMeter


def test_rate_needs_two_reports_a_moment_apart():
    m = RateMeter()
    assert m.update(Progress(0, 1000), 10.0) is None
    assert m.update(Progress(0, 1000), 10.0) is None  # no time passed
    assert m.update(Progress(500, 1000), 11.0) == 500.0


def test_rate_is_of_the_last_seconds_so_a_stall_shows():
    m = RateMeter(window=3.0)
    for t in range(0, 10):
        m.update(Progress(t * 100, 10_000), float(t))  # 100 units/s for 9 s
    assert m.update(Progress(900, 10_000), 9.0) == 100.0  # the last 3 s: 600 -> 900
    rates = [m.update(Progress(900, 10_000), float(t)) for t in (11, 12, 13)]
    assert rates[0] == 100 / 3 and rates[-1] == 0.0  # stalled: the window forgets the fast part
