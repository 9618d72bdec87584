"""A worker's lease stays fresh for as long as its work runs, however quiet the work is, and
goes stale once the work ends without a word (its worker died); a beat that finds the lease
taken over marks it lost, and the work's next confirm() stops it."""

from __future__ import annotations

import time

import pytest
from gearshift.orchestration.journal import Claim, JobJournal, Lease, LeaseLost


def test_kept_work_stays_busy_past_its_lease_and_is_taken_over_once_it_is_not(orchestration_db):
    journal = JobJournal(orchestration_db, lease_seconds=0.3)
    _, run = journal.claim("promote:quiet", "promote", {})
    with Lease(journal, run).kept():
        time.sleep(1.0)  # an evaluation reporting nothing for three leases
        assert journal.claim("promote:quiet", "promote", {})[0] is Claim.BUSY
    time.sleep(0.4)  # no one keeps it now: as if its worker had died
    claim, run = journal.claim("promote:quiet", "promote", {})
    assert claim is Claim.TAKEN_OVER and run.attempts == 2


def test_a_beat_that_finds_the_lease_taken_over_stops_the_work_at_its_next_confirm(orchestration_db):
    journal = JobJournal(orchestration_db, lease_seconds=0.3)
    _, run = journal.claim("promote:taken", "promote", {})
    lease = Lease(journal, run)
    with lease.kept():
        # A worker that takes a beat 10 ms old for dead (as one takes a stalled worker's) takes it over.
        taker = JobJournal(orchestration_db, lease_seconds=0.01)
        while (taken := taker.claim("promote:taken", "promote", {}))[0] is Claim.BUSY:
            time.sleep(0.01)
        assert taken[0] is Claim.TAKEN_OVER
        assert lease.lost.wait(2.0)  # the next beat, a third of a lease later
        with pytest.raises(LeaseLost, match=f"now {taken[1].owner}"):
            lease.confirm()
    assert journal.get("promote:taken").owner == taken[1].owner
