"""The job journal on Postgres: a key claimed twice runs once; a crashed run is taken over and
finds what it started; a finished run returns its stored result."""

from __future__ import annotations

import time

from gearshift.orchestration.journal import Claim, JobJournal, RunStatus


def test_a_second_claim_of_running_work_is_busy_then_done(orchestration_db):
    journal = JobJournal(orchestration_db, lease_seconds=60)
    first, run = journal.claim("train:a", "train", {"job": "sft"})
    assert first is Claim.NEW and run.status is RunStatus.RUNNING
    assert journal.claim("train:a", "train", {})[0] is Claim.BUSY  # a duplicate delivery
    journal.heartbeat("train:a", external_id="/runs/a", log="step 1")
    journal.succeed("train:a", {"checkpoint_id": "sft-a"})
    claim, done = journal.claim("train:a", "train", {})
    assert claim is Claim.DONE and done.result == {"checkpoint_id": "sft-a"} and done.attempts == 1
    assert done.log == "step 1" and done.finished_at_us >= done.created_at_us


def test_a_crashed_run_is_taken_over_with_its_external_id(orchestration_db):
    journal = JobJournal(orchestration_db, lease_seconds=0.05)
    journal.claim("train:b", "train", {})
    journal.heartbeat("train:b", external_id="job/gearshift-sft-b")
    time.sleep(0.1)  # the worker died: no heartbeat within the lease
    claim, run = journal.claim("train:b", "train", {})
    assert claim is Claim.TAKEN_OVER and run.external_id == "job/gearshift-sft-b" and run.attempts == 2
    # The taker's fresh heartbeat makes a third delivery (on a worker with a normal lease) back off.
    assert JobJournal(orchestration_db, lease_seconds=60).claim("train:b", "train", {})[0] is Claim.BUSY


def test_a_failed_run_can_run_again_and_latest_finds_rounds(orchestration_db):
    journal = JobJournal(orchestration_db)
    journal.claim("publish:x", "publish", {})
    journal.fail("publish:x", "Unavailable: policy server down")
    assert journal.get("publish:x").error.startswith("Unavailable")
    claim, run = journal.claim("publish:x", "publish", {})
    assert claim is Claim.TAKEN_OVER and run.attempts == 2 and journal.get("publish:x").error == ""
    journal.claim("round:1", "round", {"watermark_us": 1})
    journal.claim("round:2", "round", {"watermark_us": 2})
    assert journal.latest("round").params == {"watermark_us": 2}
    assert [r.key for r in journal.list("round")] == ["round:2", "round:1"]
