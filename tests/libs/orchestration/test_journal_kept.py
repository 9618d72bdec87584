"""A worker's lease stays fresh for as long as its work runs, however quiet the work is, and
goes stale once the work ends without a word (its worker died)."""

from __future__ import annotations

import time

from gearshift.orchestration.journal import Claim, JobJournal


def test_kept_work_stays_busy_past_its_lease_and_is_taken_over_once_it_is_not(orchestration_db):
    journal = JobJournal(orchestration_db, lease_seconds=0.3)
    journal.claim("promote:quiet", "promote", {})
    with journal.kept("promote:quiet"):
        time.sleep(1.0)  # an evaluation reporting nothing for three leases
        assert journal.claim("promote:quiet", "promote", {})[0] is Claim.BUSY
    time.sleep(0.4)  # no one keeps it now: as if its worker had died
    claim, run = journal.claim("promote:quiet", "promote", {})
    assert claim is Claim.TAKEN_OVER and run.attempts == 2
