"""The python tool: one-shot calls on warm workers, and declared stateful sessions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from gearshift.errors import InvalidArgument, NotFound, ResourceExhausted
from gearshift.services.sandbox.results import ToolOutput
from gearshift.services.sandbox.workers import RunOutcome, SpawnError, WarmPool, Worker, WorkerLimits, Zygote

log = logging.getLogger("gearshift.sandbox.python")


@dataclass
class Session:
    """A per-trajectory interpreter that keeps its variables between calls."""

    id: str
    trajectory_id: str
    worker: Worker | None = None
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Sessions:
    """Live sessions, with a cap and an idle timeout."""

    def __init__(self, zygote: Zygote, limits: WorkerLimits, max_sessions: int, idle_seconds: float):
        self.zygote = zygote
        self.limits = limits
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self._live: dict[str, Session] = {}
        self._reaper: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._live)

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_idle())

    def get(self, session_id: str, trajectory_id: str, open_session: bool) -> Session:
        """The live session; a new one only when the call opens it (its worker starts on first use).
        A session is never opened silently: a call that reached a replica which does not hold its
        session (or came after the session closed) would run in an empty interpreter."""
        session = self._live.get(session_id)
        if session is not None:
            if session.trajectory_id and trajectory_id and session.trajectory_id != trajectory_id:
                raise InvalidArgument(f"session {session_id!r} belongs to another trajectory")
            return session
        if not open_session:
            raise NotFound(f"python session {session_id!r} is not open on this sandbox replica (it closed, or lives on "
                           "another replica: send its calls to the replica that opened it, or open a new one)")
        if len(self._live) >= self.max_sessions:
            raise ResourceExhausted(f"{self.max_sessions} python sessions are live; close one or wait for idle ones to expire")
        session = self._live[session_id] = Session(session_id, trajectory_id)
        return session

    async def run(self, session: Session, code: str, timeout: float, max_output_chars: int) -> RunOutcome:
        async with session.lock:
            if session.worker is None:
                try:
                    session.worker = await self.zygote.spawn(self.limits)
                except BaseException:
                    self._live.pop(session.id, None)
                    raise
            try:
                outcome = await session.worker.run(code, timeout, max_output_chars, keep=True)
            except BaseException:
                self._drop(session)  # cancelled mid-call: its interpreter was killed
                raise
            session.last_used = time.monotonic()
            if not outcome.alive:
                self._drop(session)
                outcome.error = f"{outcome.error}; the session was closed" if outcome.error else "the session was closed"
            return outcome

    def close(self, session_id: str) -> bool:
        session = self._live.get(session_id)
        if session is None:
            return False
        self._drop(session)
        return True

    def _drop(self, session: Session) -> None:
        if self._live.get(session.id) is session:
            del self._live[session.id]
        if session.worker is not None:
            session.worker.kill()

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(self.idle_seconds / 4, 5.0))
            now = time.monotonic()
            for session in list(self._live.values()):
                if not session.lock.locked() and now - session.last_used > self.idle_seconds:
                    log.info("closing idle python session %s", session.id)
                    self._drop(session)

    async def close_all(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for session in list(self._live.values()):
            self._drop(session)


class PythonTool:
    """Runs code in a fresh isolated worker, or in a declared session; or refuses every call
    when the machine allows no isolation (refusal says why)."""

    def __init__(self, pool: WarmPool, sessions: Sessions, max_output_chars: int, refusal: str = ""):
        self.pool = pool
        self.sessions = sessions
        self.max_output_chars = max_output_chars
        self.refusal = refusal

    async def run(self, code: str, timeout: float, session_id: str, trajectory_id: str, open_session: bool = False) -> ToolOutput:
        if self.refusal:
            return ToolOutput("", is_error=True, error=self.refusal)
        try:
            if session_id:
                session = self.sessions.get(session_id, trajectory_id, open_session)
                outcome = await self.sessions.run(session, code, timeout, self.max_output_chars)
            else:
                async with self.pool.worker() as worker:
                    outcome = await worker.run(code, timeout, self.max_output_chars, keep=False)
        except SpawnError as exc:
            log.error("python worker unavailable: %s", exc)
            return ToolOutput("", is_error=True, error=f"sandbox worker unavailable: {exc}")
        return ToolOutput(
            outcome.output, is_error=not outcome.ok, error=outcome.error,
            truncated=outcome.truncated, cpu_seconds=outcome.cpu_seconds,
        )
