"""Real vLLM CPU servers for the tests that load weights into them while they run: SmolLM2 from
the local safetensors cache, started in parallel on free loopback ports, with the flags of the
end-to-end tests' server (tests/e2e/conftest.py) plus what run-time weight loading needs:

- VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: /v1/load_lora_adapter and /v1/unload_lora_adapter;
- --max-lora-rank: the project's LoRA rank (ModelConfig.lora_rank), so a trained adapter fits;
- VLLM_SERVER_DEV_MODE=1: /collective_rpc (full weights reloaded in place) and /reset_prefix_cache;
- the A^2FM parsers (gearshift.vllm_plugins.vllm_args): requests that declare tools or set
  enable_thinking get tool_calls and reasoning from the default policy's A^2FM blocks, every
  other request its text as written; no server-wide chat template, so the base model and the
  text protocol keep SmolLM2's: a request names the A^2FM one (--trust-request-chat-template).

tests/conftest.py registers the fixtures for every test directory:

    from tests.vllm_servers import vllm_pair, vllm_servers  # noqa: F401

and a test asks for `vllm_servers`, the servers' base URLs (".../v1"), serving the base model as
"smollm2" and the default policy's adapter as "default". The pair starts for the session's first
user, is paused (SIGSTOP) whenever no test uses it, and stops after its last user (tests/scheduling.py
runs the users together). A test that changes a server's base weights puts SmolLM2's back before
it ends (the servers are shared by the session).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from gearshift import vllm_plugins
from gearshift.settings import Settings
from gearshift.testing.ports import free_port
from gearshift.training.config import ModelConfig

# .ci/run installs vLLM's CPU build into its own virtual environment here (scripts/install-vllm.sh).
VLLM_PYTHON = Path(os.environ.get("GEARSHIFT_VLLM_PYTHON", Path.home() / ".cache/gearshift/vllm-venv/bin/python"))
START_SECONDS = 300  # two servers starting at once on two cores take about twice as long as one
SERVED_NAME = "smollm2"
SERVERS = 2


def vllm_command(model: Path, port: int) -> list[str]:
    from gearshift import weights  # torch and transformers: not for every pytest process that loads tests/conftest.py

    return [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--enable-prompt-tokens-details",
        "--enable-lora", "--max-lora-rank", str(ModelConfig().lora_rank),
        "--lora-modules", f"{weights.DEFAULT}={weights.DEFAULT_ADAPTER}",
        *vllm_plugins.vllm_args(chat_template=False), "--trust-request-chat-template",
    ]


def vllm_site() -> Path:
    """What every process of the servers imports first (its sitecustomize): vLLM's CPU LoRA ops
    grouped by adapter, 2.3 times faster on the default policy's prompts (vllm_site/vllm_cpu_lora.py),
    and its message queues polled instead of spun on, which halved a request's CPU (vllm_site/vllm_no_spin.py)."""
    return Path(__file__).with_name("vllm_site")


def vllm_environment(core: int, site: str | None = None) -> dict[str, str]:
    """The servers' environment; site: their PYTHONPATH instead of vllm_site() (benchmarks/vllm_spin.py).
    """
    # A 1 GiB KV cache each (~22k tokens of SmolLM2 in float32): the pair and the test process fit 24 GiB.
    # One OpenMP thread on a core of its own: SmolLM2 decodes about as fast on one as on two, and
    # two threads on shared cores spin waiting for each other whenever another process runs.
    return dict(
        os.environ, PYTHONPATH=site or str(vllm_site()), VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=str(core), HF_HUB_OFFLINE="1",
        VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", VLLM_SERVER_DEV_MODE="1",
    )


@dataclass
class VllmServers:
    """Running vLLM servers: their base URLs, and their processes, which pause and resume whole."""

    urls: list[str]
    processes: list[subprocess.Popen]

    def pause(self) -> None:
        """Stops every process of each server (SIGSTOP to its process group): idle, a vLLM CPU
        server still polls (about 1.5% of a core) and spins for a second after each request, and
        the tests between two of its users have the cores to themselves."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, number: int) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, number)


@contextlib.contextmanager
def running_vllm_servers(count: int, model: Path, logs: Path, site: str | None = None) -> Iterator[VllmServers]:
    """count vLLM servers of model, started at once; yields them when all are healthy and stops
    them afterwards. A server that exits or does not come up fails the caller with the end of its
    log (logs/server-N.log). site: as for vllm_environment."""
    if not VLLM_PYTHON.exists():
        raise RuntimeError(f"vLLM is not installed at {VLLM_PYTHON}: run scripts/install-vllm.sh")
    logs.mkdir(parents=True, exist_ok=True)
    servers = []
    try:
        for index in range(count):
            port, log = free_port(), logs / f"server-{index}.log"
            with open(log, "w") as out:
                process = subprocess.Popen(vllm_command(model, port), env=vllm_environment(index % os.cpu_count(), site), stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            servers.append((process, port, log))
        _wait_healthy(servers)
        yield VllmServers([f"http://127.0.0.1:{port}/v1" for _, port, _ in servers], [process for process, _, _ in servers])
    finally:
        for process, _, _ in servers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
            process.terminate()
        for process, _, _ in servers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_healthy(servers: list) -> None:
    deadline = time.monotonic() + START_SECONDS
    waiting = list(servers)
    while waiting:
        for server in list(waiting):
            process, port, log = server
            if process.poll() is not None:
                raise RuntimeError(f"vLLM on port {port} exited with {process.returncode}: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    waiting.remove(server)
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"vLLM did not start in {START_SECONDS} s: {waiting[0][2].read_text()[-2000:]}")
        time.sleep(1)


_running = contextlib.ExitStack()  # the session's pair while it runs


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory) -> Iterator[VllmServers]:
    """Two vLLM CPU servers of SmolLM2 with run-time weight loading on, paused between tests."""
    from gearshift import weights

    model = weights.cache_smollm2(Settings().models_dir)
    try:
        pair = _running.enter_context(running_vllm_servers(SERVERS, model, tmp_path_factory.mktemp("vllm")))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    pair.pause()
    yield pair
    stop_vllm_servers()


@pytest.fixture
def vllm_servers(vllm_pair) -> Iterator[list[str]]:
    """The pair's base URLs, the servers running for the test and paused after it."""
    vllm_pair.resume()
    yield vllm_pair.urls
    vllm_pair.pause()


def stop_vllm_servers() -> None:
    """Stops the pair (if it runs). The pair holds about 8 GiB: tests/conftest.py stops it after
    the last test that uses it, so the tests after it do not share the machine with it."""
    _running.close()


def last_user(items: list[pytest.Item]) -> str | None:
    """The node id of the last of the session's tests that uses the pair (None: none does)."""
    users = [item.nodeid for item in items if "vllm_pair" in getattr(item, "fixturenames", ())]
    return users[-1] if users else None
