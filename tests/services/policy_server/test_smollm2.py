"""The real SmolLM2-135M-Instruct behind the policy server (marker `model`: ~5 s once the
safetensors cache exists under the data dir, ~25 s the first time)."""

from __future__ import annotations

import shutil

import pytest
from gearshift import weights
from gearshift.policy_client import PolicyClient
from gearshift.services.policy_server.server import running
from gearshift.settings import PolicyServerSettings, Settings

pytestmark = pytest.mark.model


async def test_smollm2_knows_paris_and_switches_checkpoints_without_dropping_a_generation(tmp_path, record_property):
    data_dir = Settings().data_dir  # the model cache is shared across runs; everything else is temporary
    cached = weights.cache_smollm2(Settings(data_dir=data_dir).models_dir)
    copy = shutil.copytree(cached, tmp_path / "checkpoint-copy")
    settings = Settings(data_dir=data_dir, log_level="WARNING", policy_server=PolicyServerSettings(model=weights.SMOLLM2, port=0, threads=2))
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
