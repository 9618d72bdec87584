"""Steady load through the gateway, as its clients make it: concurrent clients sending chat
completions at a steady rate (all together, below the gateway's per-key limit), a mix of
instant, reasoning and agentic episodes, whole and streamed, and after some answers feedback
with a reference answer (the reward service grades it). Each
request's outcome is what its client was told, sorted as the suite counts it:

- acknowledged: a final answer naming its trajectory (the gearshift extension's trajectory_id),
  a stream's ending in data: [DONE];
- failed: an error status with OpenAI's error body and a message, or a stream's error event then
  [DONE];
- throttled: 429 from the gateway's admission control; the client waits its Retry-After and sends
  the request again (no episode ran: not counted as one);
- unclear: anything else (a connection dropped, a stream cut short, a body that is no answer and
  no error): a client that cannot tell what happened to its episode. It counts as lost."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

import httpx

ACKNOWLEDGED, FAILED, UNCLEAR, THROTTLED = "acknowledged", "failed", "unclear", "throttled"
# (model, stream): the modes as the gateway's model names; a stream learns its trajectory id first.
MIX = (("gearshift-instant", False), ("gearshift-reasoning", True), ("gearshift-agentic", False), ("gearshift-agentic", True))
FEEDBACK_EVERY = 3  # a client gives feedback on every third answer it gets
ANSWER = "Paris"  # what the instant stand-in answers in every mode


@dataclass
class Outcome:
    query: str  # unique to the request: the stored trajectories are counted by it
    kind: str  # ACKNOWLEDGED, FAILED or UNCLEAR
    trajectory_id: str = ""  # the acknowledged trajectory's (or a stream's header)
    detail: str = ""  # a failure's status and message, or what was unclear
    ended: float = 0.0  # time.monotonic()
    retry_after: float = 0.0  # THROTTLED: the seconds the gateway asked for


@dataclass
class GatewayLoad:
    """`clients` concurrent clients through the gateway at base_url, `rate` requests a second
    among them (feedback included), until stop()."""

    base_url: str
    clients: int
    rate: float
    tag: str  # in every query: which fault's load sent it
    timeout: float
    outcomes: list[Outcome] = field(default_factory=list)
    feedback: list[Outcome] = field(default_factory=list)
    throttled: int = 0  # 429s, each followed by the same request after its Retry-After

    def __post_init__(self):
        self._numbers = itertools.count()
        self._next_slot = time.monotonic()
        self._stopping = asyncio.Event()
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout)
        self._tasks = [asyncio.create_task(self._client(n)) for n in range(self.clients)]

    async def stop(self) -> None:
        """Stops sending; returns when every request under way has its outcome."""
        self._stopping.set()
        await asyncio.gather(*self._tasks)
        await self._http.aclose()

    def acknowledged_since(self, moment: float) -> int:
        return sum(1 for o in self.outcomes if o.kind == ACKNOWLEDGED and o.ended >= moment)

    async def _client(self, offset: int) -> None:
        for model, stream in itertools.islice(itertools.cycle(MIX), offset, None):
            if self._stopping.is_set():
                return
            query = f"What is the capital of France? [{self.tag} {next(self._numbers)}]"
            body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": query}]}
            outcome = await self._admitted(lambda: self._streamed(query, body) if stream else self._whole(query, body), query)
            if outcome is None:
                return
            self.outcomes.append(outcome)
            if outcome.kind == ACKNOWLEDGED and len(self.outcomes) % FEEDBACK_EVERY == 0:
                feedback = await self._admitted(lambda: self._feedback(outcome), query)
                if feedback is not None:
                    self.feedback.append(feedback)

    async def _admitted(self, send, query: str) -> Outcome | None:
        """send()'s outcome once the gateway admits it (429s waited out); None when the load
        stopped while it waited."""
        while True:
            await self._paced()
            try:
                outcome = await send()
            except httpx.HTTPError as exc:
                outcome = Outcome(query, UNCLEAR, detail=f"{type(exc).__name__}: {exc}")
            outcome.ended = time.monotonic()
            if outcome.kind != THROTTLED:
                return outcome
            self.throttled += 1
            try:
                await asyncio.wait_for(self._stopping.wait(), outcome.retry_after)
                return None
            except TimeoutError:
                continue

    async def _paced(self) -> None:
        """Waits for the next of the load's evenly spaced send times."""
        now = time.monotonic()
        slot = max(now, self._next_slot)
        self._next_slot = slot + 1 / self.rate
        await asyncio.sleep(slot - now)

    async def _whole(self, query: str, body: dict) -> Outcome:
        reply = await self._http.post("/chat/completions", json=body)
        if reply.status_code != 200:
            return failure(query, reply.status_code, reply.content, reply.headers.get("retry-after"))
        trajectory_id = (parsed(reply.content) or {}).get("gearshift", {}).get("trajectory_id")
        return Outcome(query, ACKNOWLEDGED, trajectory_id) if trajectory_id else Outcome(query, UNCLEAR, detail="200 without a trajectory")

    async def _streamed(self, query: str, body: dict) -> Outcome:
        async with self._http.stream("POST", "/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                return failure(query, reply.status_code, await reply.aread(), reply.headers.get("retry-after"))
            trajectory_id, final, error, done = reply.headers.get("x-gearshift-trajectory-id", ""), False, None, False
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                event = parsed(line.removeprefix("data: ")) or {}
                final = final or event.get("gearshift", {}).get("trajectory_id") == trajectory_id
                error = error or event.get("error")
        if done and final and not error:
            return Outcome(query, ACKNOWLEDGED, trajectory_id)
        if done and error and error.get("message"):
            return Outcome(query, FAILED, trajectory_id, f"stream {error.get('code')} {error['message']}")
        return Outcome(query, UNCLEAR, trajectory_id, "the stream ended without an answer or an error")

    async def _feedback(self, answered: Outcome) -> Outcome:
        reply = await self._http.post("/feedback", json={"trajectory_id": answered.trajectory_id, "reference_answer": ANSWER})
        if reply.status_code == 200:
            return Outcome(answered.query, ACKNOWLEDGED, answered.trajectory_id)
        return failure(answered.query, reply.status_code, reply.content, reply.headers.get("retry-after"))


def failure(query: str, status: int, content: bytes, retry_after: str | None = None) -> Outcome:
    """THROTTLED for a 429 with Retry-After, FAILED when the body is OpenAI's error object with a
    message, UNCLEAR otherwise."""
    message = ((parsed(content) or {}).get("error") or {}).get("message")
    if status == 429 and message and retry_after and retry_after.isdigit():
        return Outcome(query, THROTTLED, detail=f"{status} {message}", retry_after=float(retry_after))
    if status >= 400 and message:
        return Outcome(query, FAILED, detail=f"{status} {message}")
    return Outcome(query, UNCLEAR, detail=f"{status} {content[:120]!r}")


def parsed(text: bytes | str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
