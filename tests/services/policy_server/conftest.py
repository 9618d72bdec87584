"""Fixtures: two tiny random checkpoints with the real SmolLM2 tokenizer, made once per session,
and a real uvicorn policy server on a free loopback port."""

from __future__ import annotations

import httpx
import pytest
from gearshift import weights
from gearshift.services.policy_server.server import running
from gearshift.settings import PolicyServerSettings, Settings


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Two seeded tiny Llamas (different weights, same tokenizer) as checkpoint directories."""
    models = tmp_path_factory.mktemp("models")
    tokenizer = weights.smollm2_tokenizer(Settings().models_dir)
    return [weights.create_tiny(models / f"tiny-{seed}", seed=seed, tokenizer=tokenizer) for seed in (0, 1)]


@pytest.fixture(scope="session")
def tokenizer(tiny_checkpoints):
    return weights.load(str(tiny_checkpoints[0]), tiny_checkpoints[0].parent).tokenizer


def policy_settings(tmp_path, checkpoint, **policy) -> Settings:
    """Settings for a server on a free port serving checkpoint with one thread."""
    section = PolicyServerSettings(model=str(checkpoint), port=0, threads=1, max_tokens_cap=3000, **policy)
    return Settings(data_dir=tmp_path, metrics_port=0, log_level="WARNING", policy_server=section)


@pytest.fixture(scope="session")
async def policy_server(tmp_path_factory, tiny_checkpoints):
    """One shared server on the first tiny checkpoint (tests that switch models start their own)."""
    settings = policy_settings(tmp_path_factory.mktemp("policy"), tiny_checkpoints[0])
    async with running(settings) as server:
        yield server


@pytest.fixture
async def http(policy_server):
    async with httpx.AsyncClient(base_url=policy_server.base_url, timeout=60) as client:
        yield client
