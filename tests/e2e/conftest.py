"""Policy servers for the end-to-end tests: the built-in one and vLLM's CPU build, both serving
the real SmolLM2-135M-Instruct from the same local safetensors directory, and the default
policy (SmolLM2 plus the shipped LoRA adapter): folded in by the built-in server, applied by
vLLM as the LoRA module "default"."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from gearshift import weights
from gearshift.services.policy_server.server import running
from gearshift.settings import PolicyServerSettings, Settings

# The model cache is shared across runs (expanding the GGUF takes ~25 s); the rest is temporary.
MODELS_DIR = Settings().models_dir
# .ci/run installs vLLM's CPU build into its own virtual environment here (scripts/install-vllm.sh).
VLLM_PYTHON = Path(os.environ.get("GEARSHIFT_VLLM_PYTHON", Path.home() / ".cache/gearshift/vllm-venv/bin/python"))
VLLM_START_SECONDS = 240


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return weights.cache_smollm2(MODELS_DIR)


@pytest.fixture
async def builtin_policy(smollm2_dir, tmp_path):
    settings = Settings(data_dir=Settings().data_dir, log_level="WARNING", policy_server=PolicyServerSettings(port=0, model=str(smollm2_dir)))
    async with running(settings) as server:
        yield server.base_url


@pytest.fixture
async def builtin_default_policy(tmp_path):
    settings = Settings(data_dir=Settings().data_dir, log_level="WARNING", policy_server=PolicyServerSettings(port=0, model=weights.DEFAULT))
    async with running(settings) as server:
        yield server.base_url


@pytest.fixture(scope="session")
def vllm_policy(smollm2_dir, tmp_path_factory):
    if not VLLM_PYTHON.exists():
        pytest.fail(f"vLLM is not installed at {VLLM_PYTHON}: run scripts/install-vllm.sh")
    port = 8611
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2", VLLM_CPU_OMP_THREADS_BIND="0-1", HF_HUB_OFFLINE="1")
    command = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_dir),
        "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
        "--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"{weights.DEFAULT}={weights.DEFAULT_ADAPTER}",
    ]
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + VLLM_START_SECONDS
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not start in {VLLM_START_SECONDS} s: {log.read_text()[-2000:]}")
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
