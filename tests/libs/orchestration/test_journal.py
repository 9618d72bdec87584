"""The job journal on Postgres: a key claimed twice runs once; a crashed run is taken over and
finds what it started; a finished run returns its stored result; every write matches the lease's
owner, so the worker that was taken over can write nothing more; a run out of attempts is parked
until an operator retries it."""

from __future__ import annotations

import threading
import time

import pytest
from gearshift.orchestration.journal import PARKED, Claim, JobJournal, LeaseLost, RunStatus
from gearshift.storage import create_store_engine, upgrade_to_head


def test_a_second_claim_of_running_work_is_busy_then_done(orchestration_db):
    journal = JobJournal(orchestration_db, lease_seconds=60)
    first, run = journal.claim("train:a", "train", {"job": "sft"})
    assert first is Claim.NEW and run.status is RunStatus.RUNNING
    assert journal.claim("train:a", "train", {})[0] is Claim.BUSY  # a duplicate delivery
    journal.heartbeat("train:a", run.owner, external_id="/runs/a", log="step 1")
    journal.succeed("train:a", run.owner, {"checkpoint_id": "sft-a"})
    claim, done = journal.claim("train:a", "train", {})
    assert claim is Claim.DONE and done.result == {"checkpoint_id": "sft-a"} and done.attempts == 1
    assert done.log == "step 1" and done.finished_at_us >= done.created_at_us


def test_a_crashed_run_is_taken_over_with_its_external_id(orchestration_db):
    journal = JobJournal(orchestration_db, lease_seconds=0.05)
    _, first = journal.claim("train:b", "train", {})
    journal.heartbeat("train:b", first.owner, external_id="job/gearshift-sft-b")
    time.sleep(0.1)  # the worker died: no heartbeat within the lease
    claim, run = journal.claim("train:b", "train", {})
    assert claim is Claim.TAKEN_OVER and run.external_id == "job/gearshift-sft-b" and run.attempts == 2
    assert run.owner != first.owner
    # The taker's fresh heartbeat makes a third delivery (on a worker with a normal lease) back off.
    assert JobJournal(orchestration_db, lease_seconds=60).claim("train:b", "train", {})[0] is Claim.BUSY


def test_a_failed_run_can_run_again_and_latest_finds_rounds(orchestration_db):
    journal = JobJournal(orchestration_db)
    _, run = journal.claim("publish:x", "publish", {})
    journal.fail("publish:x", run.owner, "Unavailable: policy server down")
    assert journal.get("publish:x").error.startswith("Unavailable")
    claim, run = journal.claim("publish:x", "publish", {})
    assert claim is Claim.TAKEN_OVER and run.attempts == 2 and journal.get("publish:x").error == ""
    journal.claim("round:1", "round", {"watermark_us": 1})
    journal.claim("round:2", "round", {"watermark_us": 2})
    assert journal.latest("round").params == {"watermark_us": 2}
    assert [r.key for r in journal.list("round")] == ["round:2", "round:1"]


@pytest.fixture(params=["postgres", "sqlite"])
def journal_db(request, tmp_path):
    """The journal's database in production (Postgres) and embedded (a SQLite file, no row locks)."""
    if request.param == "postgres":
        yield request.getfixturevalue("orchestration_db")
        return
    engine = create_store_engine(f"sqlite:///{tmp_path / 'store.db'}", pool_size=2)
    upgrade_to_head(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def test_the_worker_taken_over_can_write_nothing_more_and_the_new_holder_finishes(journal_db):
    journal = JobJournal(journal_db, lease_seconds=0.05)
    _, stalled = journal.claim("promote:c", "promote", {})
    time.sleep(0.1)  # it stalled past its lease
    _, holder = journal.claim("promote:c", "promote", {})
    for write in (lambda: journal.heartbeat("promote:c", stalled.owner, log="late"),
                  lambda: journal.succeed("promote:c", stalled.owner, {"by": "stalled"}),
                  lambda: journal.fail("promote:c", stalled.owner, "late error")):
        with pytest.raises(LeaseLost, match=f"now {holder.owner}, attempt 2, running"):
            write()
    journal.succeed("promote:c", holder.owner, {"by": "holder"})
    done = journal.get("promote:c")
    assert done.status is RunStatus.SUCCEEDED and done.result == {"by": "holder"} and done.log == "" and done.error == ""
    with pytest.raises(LeaseLost):  # a finished run takes no writes, even from its holder
        journal.heartbeat("promote:c", holder.owner)


def test_two_workers_taking_over_one_stale_run_at_once_one_gets_it(orchestration_db):
    url = orchestration_db.url.render_as_string(hide_password=False)
    JobJournal(orchestration_db).claim("train:d", "train", {})
    time.sleep(1.0)  # its worker died: stale to a 0.5 s lease
    engines = [create_store_engine(url, pool_size=1) for _ in range(2)]  # a connection each, as two workers have
    start, claims = threading.Barrier(2), []

    def take(engine) -> None:
        start.wait()
        claims.append(JobJournal(engine, lease_seconds=0.5).claim("train:d", "train", {}))

    try:
        threads = [threading.Thread(target=take, args=(engine,)) for engine in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for engine in engines:
            engine.dispose()
    # The second taker waited on the first one's row lock and found its heartbeat fresh.
    assert sorted(claim for claim, _ in claims) == sorted([Claim.TAKEN_OVER, Claim.BUSY])
    taker = next(run for claim, run in claims if claim is Claim.TAKEN_OVER)
    assert JobJournal(orchestration_db).get("train:d").owner == taker.owner


def test_a_run_out_of_attempts_is_parked_with_its_error_until_retried(orchestration_db):
    journal = JobJournal(orchestration_db, lease_seconds=0.05, max_attempts=3)
    claims = []
    for _ in range(3):  # three attempts whose worker died
        claims.append(journal.claim("train:e", "train", {})[0])
        time.sleep(0.1)
    assert claims == [Claim.NEW, Claim.TAKEN_OVER, Claim.TAKEN_OVER]
    claim, parked = journal.claim("train:e", "train", {})
    assert claim is Claim.PARKED and parked.status is RunStatus.FAILED and parked.attempts == 3
    assert parked.error.startswith(f"{PARKED} 3 attempts") and "its worker died" in parked.error
    assert journal.claim("train:e", "train", {})[0] is Claim.PARKED and journal.get("train:e").error == parked.error
    assert [run.key for run in journal.parked()] == ["train:e"]

    assert journal.retry("train:e") and not journal.retry("train:nothing")
    claim, again = journal.claim("train:e", "train", {})
    assert claim is Claim.TAKEN_OVER and again.attempts == 1 and journal.parked() == []


def test_a_run_whose_last_attempt_failed_is_parked_with_that_error(orchestration_db):
    journal = JobJournal(orchestration_db, max_attempts=2)
    for _ in range(2):
        _, run = journal.claim("publish:f", "publish", {})
        journal.fail("publish:f", run.owner, "Unavailable: policy server down")
    claim, parked = journal.claim("publish:f", "publish", {})
    assert claim is Claim.PARKED and parked.error.endswith("the last: Unavailable: policy server down")
