"""The real SmolLM2-135M-Instruct behind the policy server (marker `model`: ~5 s once the
safetensors cache exists under the data dir, ~25 s the first time)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from gearshift import weights
from gearshift.policy_client import PolicyClient
from gearshift.services.policy_server.core import PolicyEngine
from gearshift.services.policy_server.schemas import ChatCompletionRequest
from gearshift.services.policy_server.server import running
from gearshift.settings import Settings

from tests import workers

pytestmark = pytest.mark.model


async def test_smollm2_knows_paris_and_switches_checkpoints_without_dropping_a_generation(tmp_path, record_property):
    data_dir = Settings().data_dir  # the model cache is shared across runs; everything else is temporary
    cached = weights.cache_smollm2(Settings(data_dir=data_dir).models_dir)
    copy = shutil.copytree(cached, tmp_path / "checkpoint-copy")
    settings = Settings(data_dir=data_dir, log_level="WARNING", policy_server=workers.policy_server(weights.SMOLLM2))
    async with running(settings) as server, PolicyClient(server.base_url, "smollm2", timeout=300) as client:
        answer = await client.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=40)
        assert "Paris" in answer.content and answer.finish_reason == "stop"
        assert answer.usage.prompt_tokens > 10 and 0 < answer.usage.completion_tokens <= 40

        prompt, greedy = "The capital of France is", {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
        reference = (await client.complete(prompt, **greedy)).text
        stream = client.stream(prompt, **greedy)
        pieces = [(await anext(stream)).text]
        report = await client.load(str(copy))
        pieces += [chunk.text async for chunk in stream]
        record_property("switch_total_seconds", report["total_seconds"])
        record_property("load_seconds_at_start", server.engine.current.load_seconds)
        assert report["in_flight"] == 1  # its time is a benchmark figure (benchmarks/policy_server.py), not a test
        assert "".join(pieces) == reference
        assert server.engine.current.path == copy
        assert (await client.complete(prompt, **greedy)).text == reference  # same weights, new directory


async def test_smollm2_gives_the_same_greedy_tokens_with_drafts():
    """Prompt lookup on the real model, where the logits are not a random model's: a turn that
    quotes a text from its prompt takes the same tokens with drafts as without, in fewer steps."""
    quoted = "The Eiffel Tower is 330 metres tall. It was completed in 1889 for the World's Fair in Paris."
    messages = [{"role": "user", "content": f"Repeat this text word for word, twice: {quoted}"}]
    request = ChatCompletionRequest(messages=messages, max_tokens=48, temperature=0, ignore_eos=True)
    models_dir = Settings().models_dir
    results, steps = [], []
    for drafts in (0, 4):
        settings = workers.policy_server(weights.SMOLLM2, speculative_tokens=drafts)
        engine = await PolicyEngine.start(settings, models_dir)
        try:
            results.append(await engine.generate_all(engine.chat_jobs(request).jobs[0]))
            steps.append(engine.scheduler.stats.steps)
        finally:
            engine.close()
    assert results[1].token_ids == results[0].token_ids
    assert "330 metres" in results[0].text
    assert steps[1] < steps[0] * 0.7  # most tokens came from drafts the model agreed with


SWITCH_THEN_EXIT = """
import asyncio
from gearshift.policy_client import PolicyClient
from gearshift.services.policy_server.server import running
from gearshift.settings import Settings

async def main():
    # Two threads, a `gearshift loop`'s default (LoopConfig.threads), under which the abort was found.
    settings = Settings(log_level="WARNING", policy_server={"model": "smollm2", "port": 0, "threads": 2})
    async with running(settings) as server, PolicyClient(server.base_url, "smollm2", timeout=300) as client:
        await client.complete("The capital of France is", max_tokens=4, temperature=0)
        await client.load("smollm2")

asyncio.run(main())
"""


def test_a_process_that_switches_weights_and_stops_at_once_exits_cleanly():
    """A hot switch leaves the scheduler thread repacking the new weights; a process that stops
    right after (a `gearshift loop` that published its candidate) aborted in that kernel
    ("terminate called without an active exception", exit 134) until closing waited for it."""
    done = subprocess.run([sys.executable, "-c", SWITCH_THEN_EXIT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
