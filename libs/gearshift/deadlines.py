"""The deadline of the work in hand, carried from call to call (as Go's context carries one).

A service's request interceptor sets it from the incoming call's deadline; the executor narrows
it to the episode's remaining budget. Every gRPC call a client channel makes (clients.py) and
every request of the policy client (policy_client.py) is then bounded by it: a caller that has
given up is never still being worked for downstream, and an episode's budget holds during a
step, not only between steps. It lives in a context variable, so it follows a request into the
tasks it starts and no further.

    with deadlines.within(time.monotonic() + 30):
        await stub.Route(request)  # at most 30 s, or less if the caller's own deadline is sooner
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

_DEADLINE: ContextVar[float | None] = ContextVar("gearshift_deadline", default=None)  # a time.monotonic() value


def current() -> float | None:
    """The deadline in hand (a time.monotonic() value), or None: none."""
    return _DEADLINE.get()


def remaining() -> float | None:
    """Seconds left before the deadline in hand (0 or less: it has passed), or None: no deadline."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


def bound(timeout: float | None) -> float | None:
    """timeout, shortened to the time left before the deadline in hand."""
    left = remaining()
    if left is None:
        return timeout
    left = max(left, 0.0)
    return left if timeout is None else min(timeout, left)


def limit(seconds: float | None) -> None:
    """From now on in this context, the work must end within seconds (a sooner deadline in hand
    stays). For a task's whole life: a server's handler, whose context is its own."""
    if seconds is not None:
        _DEADLINE.set(_sooner(time.monotonic() + seconds, _DEADLINE.get()))


@contextlib.contextmanager
def within(deadline: float | None, *, replace: bool = False) -> Iterator[None]:
    """Work in the block ends by deadline (a time.monotonic() value): the sooner of it and the
    deadline in hand, or with replace, deadline alone (None: no deadline), for work that must
    outlive the caller's (an episode's wrap-up, which stores what the episode did)."""
    token = _DEADLINE.set(deadline if replace else _sooner(deadline, _DEADLINE.get()))
    try:
        yield
    finally:
        try:
            _DEADLINE.reset(token)
        except ValueError:  # an async generator closed from another task (its finalizer's): that context is not ours to restore
            pass


def _sooner(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
