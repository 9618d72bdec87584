"""How the fault suite sorts what a client was told and counts it against the store: the
suite's verdict rests on these, so they are checked on their own, without a platform."""

from __future__ import annotations

import json
from collections import Counter

from tests.faults import tally
from tests.faults.faults import SHORT, FaultRun
from tests.faults.load import ACKNOWLEDGED, FAILED, THROTTLED, UNCLEAR, Outcome, failure


def error(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": 503}}).encode()


def test_an_error_with_a_message_is_failed_a_429_is_throttled_anything_else_unclear():
    assert failure("q", 503, error("executor is unavailable; retry later")).kind == FAILED
    throttled = failure("q", 429, error("limited"), retry_after="2")
    assert (throttled.kind, throttled.retry_after) == (THROTTLED, 2.0)
    assert failure("q", 429, error("limited")).kind == FAILED  # no Retry-After: the client cannot wait it out
    assert failure("q", 502, b"<html>Bad Gateway</html>").kind == UNCLEAR
    assert failure("q", 500, error("")).kind == UNCLEAR
    assert failure("q", 200, error("not an error status")).kind == UNCLEAR


def test_lost_counts_acknowledged_but_not_stored_and_unclear_never_failed():
    outcomes = [
        Outcome("q1", ACKNOWLEDGED, "t1"),  # stored
        Outcome("q2", ACKNOWLEDGED, "t2"),  # not in the store
        Outcome("q3", ACKNOWLEDGED, "t3"),  # its id stored with another request's query
        Outcome("q4", FAILED, detail="503 executor is unavailable"),
        Outcome("q5", UNCLEAR, detail="RemoteProtocolError"),
    ]
    feedback = [Outcome("q1", ACKNOWLEDGED, "t1"), Outcome("q1", FAILED, detail="404 no trajectory t1")]
    run = FaultRun("kill -9 store replica", 3.0, outcomes, feedback, 4, ["restarted"], True)
    row = tally.row(run, {"t1": "q1", "t3": "q9", "t4": "q4"})
    assert (row.requests, row.acknowledged, row.stored, row.failed, row.lost, row.throttled) == (5, 3, 1, 1, 3, 4)
    assert row.feedback == Counter({ACKNOWLEDGED: 1, FAILED: 1})
    assert row.told == Counter({"503 executor is unavailable": 1, "RemoteProtocolError": 1, "feedback: 404 no trajectory t1": 1})
    assert "| kill -9 store replica | 3.0 | 5 | 3 | 1 | 1 | 3 | 4 | 1 / 1 | restarted |" in tally.table([row], SHORT)


def test_a_query_stored_twice_is_reported():
    assert tally.twice({"t1": "q1", "t2": "q2", "t3": "q1"}) == ["q1"]

