"""The Celery app: Redis broker and result backend (Settings.redis_url).

Tasks acknowledge only after they finish (acks_late) and a task whose worker dies is put back
on the queue (task_reject_on_worker_lost), so nothing is lost; each task claims a dedupe key in
the job journal before any side effect, so a redelivered task does nothing twice. A worker
takes one task at a time (prefetch 1): training tasks are long.

    celery -A gearshift.orchestration.app worker -Q default,training
    celery -A gearshift.orchestration.app beat      # the training trigger
"""

from __future__ import annotations

from celery import Celery

from gearshift.settings import get_settings

QUEUES = ("default", "training")


def create_app(redis_url: str | None = None) -> Celery:
    settings = get_settings()
    url = redis_url or settings.redis_url
    app = Celery("gearshift", broker=url, backend=url, include=["gearshift.orchestration.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue="default",
        task_routes={"gearshift.orchestration.tasks.train": {"queue": "training"}},
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_extended=True,
        broker_connection_retry_on_startup=True,
        # Longer than any training run, so Redis does not hand a running task to a second worker.
        broker_transport_options={"visibility_timeout": int(settings.orchestration.job_timeout_seconds) + 3600},
        beat_schedule={
            "training-trigger": {
                "task": "gearshift.orchestration.tasks.check_trigger",
                "schedule": settings.orchestration.trigger_interval_seconds,
            }
        },
    )
    return app


app = create_app()
