"""ScriptedPolicy: an OpenAI-compatible HTTP server whose "model" is a Python function.

It is a stand-in, named as such: it isolates the executor's own logic and overhead from model
time (deterministic tool calls in tests, zero-latency turns in benchmarks). End-to-end tests
use the real policy server with the real model."""

from gearshift.teaching.endpoint import Responder, _cut, _usage, reply, serve_function

serve_scripted = serve_function

__all__ = ["Responder", "reply", "serve_scripted", "_cut", "_usage"]
