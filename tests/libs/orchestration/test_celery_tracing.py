"""Traces across the Celery queues, with a real beat and worker as subprocesses exporting over
OTLP/gRPC to a receiver in the test: a training round, from the beat's trigger through every task
of its chain to the training run, is one connected trace, and the tasks' store calls are in it."""

from __future__ import annotations

import pytest
from gearshift.testing.otlp_receiver import OtlpReceiver

from tests.libs.orchestration.celery_processes import cluster, until
from tests.libs.orchestration.test_celery_beat import seed_scored

pytestmark = pytest.mark.slow

TASKS = "gearshift.orchestration.tasks"
ROUND = [f"celery.task {TASKS}.{name}" for name in ("check_trigger", "score_new", "build_snapshot", "train")]


async def test_a_training_round_is_one_trace_from_the_beat_to_the_training_run(tmp_path, orchestration_db):
    with OtlpReceiver() as receiver:
        async with cluster(tmp_path, orchestration_db, trigger_interval_seconds=1, trigger_new_scored=2) as running:
            await seed_scored(running.settings.store_addr, running.settings, 2)
            traced = {"GEARSHIFT_TRACING__ENABLED": "true", "GEARSHIFT_TRACING__OTLP_ENDPOINT": receiver.endpoint}
            running.worker("worker", **traced)
            running.beat("beat", **traced)
            await running.ready("worker")
            await until(lambda: (runs := running.journal.list("train")) and runs[0].status == "succeeded", 60, "the training run")

            def the_round():
                trained = [span for span in receiver.spans if span.name == ROUND[-1]]
                spans = receiver.trace(trained[0].trace_id) if trained else []
                return set(ROUND) <= {span.name for span in spans} and spans

            try:
                spans = await until(the_round, 30, "the round's spans (exported every few seconds)")
            except AssertionError as missing:
                seen = sorted({(span.service, span.name, bool(span.parent_span_id)) for span in receiver.spans})
                raise AssertionError(f"{missing}; received (service, name, has a parent): {seen}; worker log: {running.log('worker')}") from None

    (root,) = [span for span in spans if not span.parent_span_id]
    assert (root.service, root.name) == ("beat", f"publish {TASKS}.check_trigger")
    ids = {span.span_id for span in spans}
    assert all(span.parent_span_id in ids for span in spans if span is not root), "a span whose parent is not in the trace"
    by_id = {span.span_id: span for span in spans}
    for name in ROUND:
        (run,) = [span for span in spans if span.name == name]
        assert run.service == "worker" and run.attributes["celery.state"] == "SUCCESS"
        assert by_id[run.parent_span_id].name.startswith("publish "), f"{name} continues no publish"
    tasks = {span.span_id for span in spans if span.name in ROUND}
    store_calls = [span for span in spans if "TrajectoryStore" in span.name and span.parent_span_id in tasks]
    assert store_calls, "no store call under a task"
