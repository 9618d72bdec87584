"""The Celery app: Redis broker and result backend (Settings.redis_url).

Tasks acknowledge only after they finish (acks_late) and a task whose worker dies is put back
on the queue (task_reject_on_worker_lost), so nothing is lost; each task claims a dedupe key in
the job journal before any side effect, so a redelivered task does nothing twice. A worker
takes one task at a time (prefetch 1): training tasks are long.

Redis hands a task its worker has not acknowledged to another worker after the visibility
timeout (orchestration.visibility_timeout_seconds, minutes), so a task lost with its worker
comes back soon. A long task (a training run watched for hours) is handed out again while its
worker still holds it: that copy finds the journal's lease fresh and waits to check again
(tasks.Busy), so it starts nothing, and it is what takes over if the holder dies.

On SIGTERM a worker shuts down softly (orchestration.soft_shutdown_seconds): running tasks get
that long, then the rest are stopped and put back on the queue. The worker also serves
gearshift_celery_queue_length on orchestration.metrics_port. With tracing on, every task sent
and run is a span of the trace that sent it (traced_tasks.py).

    celery -A gearshift.orchestration.app worker -Q default,training
    celery -A gearshift.orchestration.app beat      # the training trigger: one per cluster
"""

from __future__ import annotations

import logging
import os

import redis
from celery import Celery
from celery.signals import worker_ready
from kombu.transport.redis import PRIORITY_STEPS, Channel
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import GaugeMetricFamily

from gearshift.orchestration import traced_tasks  # noqa: F401  (its signal handlers trace every task sent and run)
from gearshift.settings import OrchestrationSettings, get_settings

log = logging.getLogger(__name__)

QUEUES = ("default", "training")
APP = "gearshift.orchestration.app"  # what `celery -A` names


def transport_options(orchestration: OrchestrationSettings) -> dict:
    """Redis' visibility timeout, and unacknowledged messages swept for expiry every tenth of it
    (1-10 s): kombu's default sweep, every 100 s, would outlast a short timeout."""
    timeout = orchestration.visibility_timeout_seconds
    return {"visibility_timeout": timeout, "unacked_restore_interval": max(1.0, min(10.0, timeout / 10)), "unacked_restore_throttle": 1}


def create_app(redis_url: str | None = None) -> Celery:
    settings = get_settings()
    orchestration = settings.orchestration
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
        broker_transport_options=transport_options(orchestration),
        # Soft shutdown, then the tasks left are put back on the queue. Not on an idle worker:
        # a busy check it holds (a countdown message) is still unacknowledged in Redis and
        # comes back after the visibility timeout, and an idle worker stops at once.
        worker_soft_shutdown_timeout=orchestration.soft_shutdown_seconds,
        worker_enable_soft_shutdown_on_idle=False,
        beat_schedule={
            "training-trigger": {
                "task": "gearshift.orchestration.tasks.check_trigger",
                "schedule": orchestration.trigger_interval_seconds,
                # A trigger no worker ran within its interval is superseded by the next one.
                "options": {"expires": orchestration.trigger_interval_seconds},
            }
        },
    )
    return app


def queue_lengths(client: redis.Redis, queues=QUEUES) -> dict[str, int]:
    """Messages waiting in each queue: the LLEN of its Redis list and of its priority lists
    (kombu keeps priority p > 0 of queue q in the list q + sep + p), as kombu counts a queue."""
    with client.pipeline() as pipe:
        for queue in queues:
            for priority in PRIORITY_STEPS:
                pipe.llen(f"{queue}{Channel.sep}{priority}" if priority else queue)
        sizes = pipe.execute()
    steps = len(PRIORITY_STEPS)
    return {queue: sum(sizes[i * steps:(i + 1) * steps]) for i, queue in enumerate(queues)}


class QueueLengthCollector:
    """gearshift_celery_queue_length{queue}, read from Redis at scrape time (what an
    autoscaler reads besides KEDA's redis scaler). Redis unreachable: no samples, so a stale
    length is never reported."""

    def __init__(self, redis_url: str, queues=QUEUES):
        self.client = redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=2)
        self.queues = queues

    def collect(self):
        gauge = GaugeMetricFamily("gearshift_celery_queue_length", "Messages waiting in each Celery queue (Redis LLEN at scrape time)",
                                  labels=["queue"])
        try:
            lengths = queue_lengths(self.client, self.queues)
        except redis.RedisError as error:
            log.warning("queue lengths unreadable: %s", error)
            lengths = {}
        for queue, length in lengths.items():
            gauge.add_metric([queue], length)
        yield gauge


def serve_metrics(app: Celery, port: int, host: str) -> None:
    """The worker's /metrics: queue lengths and the process' own. A second worker on the same
    machine finds the port taken and serves none (the lengths are the same from either)."""
    REGISTRY.register(QueueLengthCollector(app.conf.broker_url))
    try:
        start_http_server(port, addr=host)
    except OSError as error:
        log.warning("worker metrics not served on %s:%d: %s", host, port, error)
        return
    log.info("worker metrics on %s:%d", host, port)


def soft_shutdown_on_sigterm(worker) -> None:
    """Makes SIGTERM (what Kubernetes and `gearshift up` send) start the soft shutdown, as
    REMAP_SIGTERM=SIGQUIT in the worker's environment does: Celery's SIGTERM is a warm shutdown,
    which waits for a training watch however long it takes."""
    from celery.apps.worker import during_soft_shutdown, install_worker_term_hard_handler, on_cold_shutdown

    def on_sigterm(worker) -> None:
        # A second SIGTERM during the wait stops the tasks at once, as a second SIGQUIT does.
        install_worker_term_hard_handler(worker, sig="SIGTERM", callback=during_soft_shutdown)
        on_cold_shutdown(worker)

    install_worker_term_hard_handler(worker, sig="SIGTERM", callback=on_sigterm)


@worker_ready.connect
def _on_worker_ready(sender, **_) -> None:
    """In a worker's main process once it consumes (its pool already started)."""
    settings = get_settings()
    orchestration = settings.orchestration
    if orchestration.soft_shutdown_seconds > 0 and os.environ.get("REMAP_SIGTERM") != "SIGQUIT":
        soft_shutdown_on_sigterm(sender.controller)
    if orchestration.metrics_port:
        serve_metrics(sender.app, orchestration.metrics_port, settings.host)


app = create_app()
