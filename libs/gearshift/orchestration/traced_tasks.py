"""Traces across the Celery queues (Settings.tracing): each task sent carries the traceparent of a
producer span, and the worker runs it in a consumer span continuing it, under which the task's
own calls (store, reward, policy) record. A task sent by a traced task joins its trace, so a
training round, from the beat's trigger to the publish, is one trace.

Tracers are made in the process that uses them, at first use: never in a prefork worker's parent,
whose exporter thread would not survive the fork."""

from __future__ import annotations

import contextlib

from celery.signals import beat_init, before_task_publish, task_postrun, task_prerun
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from gearshift import tracing
from gearshift.settings import get_settings

_in_beat = False
_running: dict[str, tuple[contextlib.ExitStack, Span]] = {}  # task id -> its span, and what closes it


@beat_init.connect
def _beat_started(**_) -> None:
    global _in_beat
    _in_beat = True


@before_task_publish.connect
def _carry_trace(sender: str | None = None, headers: dict | None = None, **_) -> None:
    if headers is None:
        return
    fallback = tracing.setup(get_settings(), "beat") if _in_beat else None
    headers.update(tracing.publish_headers(f"publish {sender}", fallback))


@task_prerun.connect
def _start_span(task_id: str, task, **_) -> None:
    tracer = tracing.setup(get_settings(), "worker")
    if tracer is None:
        return
    carrier = {"traceparent": task.request.get("traceparent") or "", "tracestate": task.request.get("tracestate") or ""}
    attributes = {"messaging.system": "celery", "messaging.message.id": task_id, "celery.retries": task.request.retries or 0}
    stack = contextlib.ExitStack()
    span = stack.enter_context(tracing.serving(tracer, f"celery.task {task.name}", carrier, kind=SpanKind.CONSUMER, attributes=attributes))
    _running[task_id] = stack, span


@task_postrun.connect
def _end_span(task_id: str, state: str | None = None, **_) -> None:
    if task_id not in _running:
        return
    stack, span = _running.pop(task_id)
    span.set_attribute("celery.state", state or "unknown")
    if state not in ("SUCCESS", "RETRY"):
        span.set_status(Status(StatusCode.ERROR, state or "unknown"))
    stack.close()
