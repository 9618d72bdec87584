"""ScriptedPolicy: an OpenAI-compatible HTTP server whose "model" is a Python function.

It is a stand-in, named as such: it isolates the executor's own logic and overhead from model
time (deterministic tool calls in tests, zero-latency turns in benchmarks). End-to-end tests
use the real policy server with the real model. A function may answer a chat request with a
dict, an assistant message with tool_calls and reasoning_content as an engine's parsers return
it (endpoint.ChatReply): the native protocol's stand-in."""

import asyncio
import contextlib
import functools
import subprocess
import sys
from collections.abc import Iterator

from gearshift.protocol.sr2am import PLAN_HEAD
from gearshift.teaching.endpoint import Responder, _cut, _usage, reply, serve_function

# Its token ids are stand-ins too: one per character, its code point (endpoint._stand_in_ids).
serve_scripted = functools.partial(serve_function, stand_in_ids=True)

__all__ = ["Responder", "instant_policy", "reply", "serve_scripted", "_cut", "_usage"]


SEARCH_CALL = "<tool_call>\n{'id': 1, 'name': 'web_search', 'arguments': {'query': 'capital of France'}}\n</tool_call>"


def instant_policy(body: dict) -> str:
    """A stand-in answering every call of an episode at once, for the benchmarks of the
    platform's own overhead: the configurator acts without a plan ("Plan: None"), the agent
    makes one web_search call, and every mode answers Paris."""
    messages = body.get("messages") or []
    last = messages[-1]["content"] if messages else ""
    if last.endswith(PLAN_HEAD) or last.startswith("You regulate"):  # in the agent's message, or the prompt form
        return " None" if last.endswith(PLAN_HEAD) else "ACT"
    if "<tool_response>" in last:
        return "<answer>Paris</answer>"
    if last.rstrip().endswith("<answer>"):
        return "Paris</answer>"
    if last.rstrip().endswith("<reasoning>"):
        return "France's capital is Paris.</reasoning>\n<answer>Paris</answer>"
    return "Searching.</plan>\n" + SEARCH_CALL


@contextlib.contextmanager
def instant_policy_process() -> Iterator[str]:
    """instant_policy served as "smollm2" in a process of its own, so that it shares no core
    with a benchmark's load; yields its base URL."""
    process = subprocess.Popen([sys.executable, "-m", __name__], stdout=subprocess.PIPE, text=True)
    try:
        yield process.stdout.readline().strip()
    finally:
        process.terminate()
        process.wait(timeout=10)


async def _serve_instant_policy() -> None:
    async with serve_scripted(instant_policy, model="smollm2") as url:
        print(url, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve_instant_policy())
