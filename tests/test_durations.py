"""The suite's guard against regrowth (tests/durations.py): every test that took longer than a
minute in the last run's report carries a mark naming why."""

from __future__ import annotations

from tests.durations import SLOW_SECONDS, last_report, plain_id, reasons, unmarked_slow, why_slow


def test_every_test_over_a_minute_in_the_last_run_carries_a_mark_naming_why(request):
    assert unmarked_slow(last_report(), reasons(request.session.items)) == []


def test_a_slow_test_without_a_reason_is_listed_and_one_with_a_reason_is_not(request):
    items = request.session.items
    unmarked = next(item for item in items if why_slow(item) is None)
    marked = next((item for item in items if why_slow(item) is not None), None)
    seconds = {plain_id(unmarked.nodeid): SLOW_SECONDS + 1}
    if marked is not None:  # a run of a few tests may select none
        seconds[plain_id(marked.nodeid)] = SLOW_SECONDS + 1
    assert unmarked_slow(seconds, reasons(items)) == [f"{plain_id(unmarked.nodeid)} ({SLOW_SECONDS + 1:.0f} s)"]
    assert unmarked_slow({plain_id(unmarked.nodeid): SLOW_SECONDS}, reasons(items)) == []

