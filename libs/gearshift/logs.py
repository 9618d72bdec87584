"""Log lines that an on-call engineer can join up: plain text (the default, for a terminal) or JSON
lines (Settings.log_format) that carry the ids of what caused them: the trace and span id of the
current OpenTelemetry span, the request id and the trajectory id.

The ids travel in context variables. The trajectory id sits in a small mutable holder that each
request makes afresh: an episode learns its id after it started, often inside a task of its own,
and a holder shared by the request's tasks lets every later line of the request carry it (a
context variable set in a child task is never seen by its parent)."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from dataclasses import dataclass
from datetime import datetime, timezone

from opentelemetry import trace

# The request id of the call being served; clients send it on (x-request-id) to every service.
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
REQUEST_ID_KEY = "x-request-id"
TRAJECTORY_ID_KEY = "x-trajectory-id"  # metadata key and HTTP header that carry it between services
UNSET = "-"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass
class _RequestIds:
    trajectory_id: str = UNSET


_ids: contextvars.ContextVar[_RequestIds | None] = contextvars.ContextVar("request_ids", default=None)


def begin_request(trajectory_id: str | None = None) -> None:
    """A fresh holder for the request now being served (the trajectory id its caller sent, if any)."""
    _ids.set(_RequestIds(trajectory_id or UNSET))


def bind_trajectory(trajectory_id: str) -> None:
    """Every later log line of this request (its tasks included) carries trajectory_id."""
    holder = _ids.get()
    if holder is None:
        holder = _RequestIds()
        _ids.set(holder)
    holder.trajectory_id = trajectory_id


def trajectory_id() -> str:
    holder = _ids.get()
    return holder.trajectory_id if holder is not None else UNSET


def id_headers() -> dict[str, str]:
    """The request and trajectory ids to send on with a call (those that are set)."""
    ids = {REQUEST_ID_KEY: request_id.get(), TRAJECTORY_ID_KEY: trajectory_id()}
    return {key: value for key, value in ids.items() if value != UNSET}


class ContextIds(logging.Filter):
    """Adds trace_id, span_id, request_id and trajectory_id to every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        span = trace.get_current_span().get_span_context()
        record.trace_id = format(span.trace_id, "032x") if span.is_valid else UNSET
        record.span_id = format(span.span_id, "016x") if span.is_valid else UNSET
        record.request_id = request_id.get()
        record.trajectory_id = trajectory_id()
        return True


class JsonLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the ids, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **{key: getattr(record, key, UNSET) for key in ("trace_id", "span_id", "request_id", "trajectory_id")},
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def handler(log_format: str, stream=None) -> logging.Handler:
    """A stream handler (stderr by default) writing log_format ("text" or "json") with the ids."""
    made = logging.StreamHandler(stream or sys.stderr)
    made.addFilter(ContextIds())
    made.setFormatter(JsonLines() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    return made


def configure(level: str, log_format: str = "text") -> None:
    """The process's root logger: level, and one handler in log_format."""
    logging.basicConfig(level=level.upper(), handlers=[handler(log_format)])
