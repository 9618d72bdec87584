"""Policy servers for the end-to-end tests: the built-in one and vLLM's CPU build, both serving
the real SmolLM2-135M-Instruct from the same local safetensors directory, and the default
policy (SmolLM2 plus the shipped LoRA adapter): folded in by the built-in server, applied by
vLLM as the LoRA module "default"."""

from __future__ import annotations

from pathlib import Path

import pytest
from gearshift import weights
from gearshift.services.policy_server.server import running
from gearshift.settings import Settings

from tests import workers

# The model cache is shared across runs (expanding the GGUF takes ~25 s); the rest is temporary.
MODELS_DIR = Settings().models_dir


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return weights.cache_smollm2(MODELS_DIR)


# Each server is shared by the session's tests: none of them changes what it serves.
@pytest.fixture(scope="session")
async def builtin_policy(smollm2_dir):
    settings = Settings(data_dir=Settings().data_dir, log_level="WARNING", policy_server=workers.policy_server(str(smollm2_dir)))
    async with running(settings) as server:
        yield server.base_url


@pytest.fixture(scope="session")
async def builtin_default_policy():
    settings = Settings(data_dir=Settings().data_dir, log_level="WARNING", policy_server=workers.policy_server(weights.DEFAULT))
    async with running(settings) as server:
        yield server.base_url


@pytest.fixture
def vllm_policy(vllm_servers) -> str:
    """vLLM's CPU build serving SmolLM2 as "smollm2" and the default policy as the LoRA module
    "default": the first of the session's pair (tests/vllm_servers.py), not a third server."""
    return vllm_servers[0]
