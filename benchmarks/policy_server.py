"""The built-in policy server against vLLM's CPU build, both serving the cached SmolLM2-135M
safetensors directory, measured in one run and printed as JSON:

- throughput: total completion tokens/s with 1, 4 and 8 concurrent streamed completions
  (greedy, ignore_eos, `--tokens` each, distinct prompts), and the median time to first token;
- episode: the model time of a 4-turn agentic episode as the executor sends it (the executor's
  system prompt; every turn continues the one growing assistant message with
  continue_final_message, stops at </tool_call> or </answer>, and gets a tool response from the
  sandbox's sample corpus appended: search snippets, then two pages);
- switch: POST /v1/load to a copy of the checkpoint while a stream is in flight;
- with --gguf, also expanding the GGUF to safetensors once (a child process, a fresh directory).

Three servers, each its own process, started side by side and measured in turn, rotating the
order every round (the machine is shared: quote medians and ratios):

- builtin: the built-in server with its default settings (batching, prefix cache);
- builtin-unbatched: the same server as it was before batching: one generation at a time
  (max_batch_size 1) and no prefix cache (its lone greedy rows draft by prompt lookup, as the
  built-in server's do);
- vllm: vLLM's CPU build (--enforce-eager, float32 as the end-to-end tests run it, or --dtype).

    .venv/bin/python benchmarks/policy_server.py [--rounds 3] [--tokens 64] [--threads 2] [--dtype float32] [--sleep-wait] [--busy 1] [--no-vllm] [--gguf]

--sleep-wait starts both built-in servers with spin_wait false (their idle OpenMP thread sleeps
between kernels instead of spinning; the default before stop 21). --busy N runs N busy-looping processes
beside the servers while they are measured: a machine shared with other work.

Goals (issue 13): builtin at 8 concurrent requests at least vllm's tokens/s; builtin single
stream no slower than builtin-unbatched; the episode at least 1.5x faster with the prefix cache
(builtin) than without (builtin-unbatched).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from gearshift import weights
from gearshift.api.common.v1.common_pb2 import Mode
from gearshift.policy_client import PolicyClient
from gearshift.protocol import a2fm, prompts
from gearshift.services.sandbox.corpus import SAMPLE_CORPUS
from gearshift.settings import Settings

VLLM_PYTHON = Path(os.environ.get("GEARSHIFT_VLLM_PYTHON", Path.home() / ".cache/gearshift/vllm-venv/bin/python"))
START_SECONDS = 300
BASE_PORT = 8650
CONCURRENCY = (1, 4, 8)
TOPICS = ["Rome", "the ocean", "a lighthouse", "trains", "the moon", "bread", "a violin", "winter", "bees", "chess"]
EPISODE_QUERIES = [
    "Which river flows through Paris, and how tall is the Eiffel Tower?",
    "How deep is the Pacific Ocean, and who first climbed Mount Everest?",
    "Through which countries does the Amazon River flow?",
    "When was the Eiffel Tower completed, and what is the deepest point of the Pacific?",
    "What is the largest river by discharge, and where is Mount Everest?",
]
TURN_TOKENS = 64  # max_tokens of one episode turn
# Pause before each measurement: vLLM's worker keeps a core busy for about a second after its
# last request finished (measured), which slowed whichever server the rotation put after it.
SETTLE_SECONDS = 2.0
TURN_STOPS = ["</tool_call>", "</answer>"]
EXPAND = "import sys; from pathlib import Path; from gearshift.weights import cache_smollm2; cache_smollm2(Path(sys.argv[1]))"


@dataclass
class Server:
    """A policy server process, started from a command line."""

    name: str
    command: list[str]
    env: dict[str, str]
    port: int
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, logs: Path) -> None:
        self.log = logs / f"{self.name}.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            time.sleep(1)
        raise RuntimeError(f"{self.name} did not start in {START_SECONDS} s: {self.log.read_text()[-2000:]}")

    def peak_rss_mib(self) -> int:
        """Peak resident memory of the server and its children (vLLM runs an engine process)."""
        root = psutil.Process(self.process.pid)
        total = 0
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                status = Path(f"/proc/{process.pid}/status").read_text()
                total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
        return round(total / 1024)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def builtin(name: str, checkpoint: Path, data_dir: Path, port: int, threads: int, dtype: str, **policy) -> Server:
    env = dict(os.environ, GEARSHIFT_DATA_DIR=str(data_dir), GEARSHIFT_LOG_LEVEL="WARNING", GEARSHIFT_METRICS_PORT="0")
    settings = {"model": str(checkpoint), "port": port, "threads": threads, "dtype": dtype, **policy}
    env |= {f"GEARSHIFT_POLICY_SERVER__{key.upper()}": str(value) for key, value in settings.items()}
    return Server(name, [sys.executable, "-m", "gearshift.services.policy_server"], env, port)


def vllm(checkpoint: Path, port: int, threads: int, dtype: str) -> Server:
    env = dict(
        os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2", VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
        HF_HUB_OFFLINE="1",
    )
    command = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
        "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, "--max-model-len", "2048", "--enforce-eager",
    ]
    return Server("vllm", command, env, port)


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    """Processes that burn a core each until the block exits."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@contextlib.contextmanager
def started(servers: list[Server], logs: Path) -> Iterator[list[Server]]:
    try:
        for server in servers:  # all start at once; the waits overlap
            server.start(logs)
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


# Measurements


async def timed_stream(client: PolicyClient, prompt: str, tokens: int) -> tuple[float, float, int]:
    """(seconds to the first text, seconds to the end, completion tokens) of one streamed completion."""
    started_at = time.perf_counter()
    first, usage = None, None
    async for chunk in client.stream(prompt, max_tokens=tokens, temperature=0, ignore_eos=True):
        if chunk.text and first is None:
            first = time.perf_counter() - started_at
        usage = chunk.usage or usage
    return first or 0.0, time.perf_counter() - started_at, usage.completion_tokens


async def throughput(url: str, concurrency: int, tokens: int, round_index: int) -> dict:
    async with PolicyClient(url, "smollm2", timeout=600, retries=0) as client:
        prompts_now = [f"Write a short story about {TOPICS[(round_index + i) % len(TOPICS)]} (draft {round_index}.{i})." for i in range(concurrency)]
        started_at = time.perf_counter()
        runs = await asyncio.gather(*(timed_stream(client, prompt, tokens) for prompt in prompts_now))
        wall = time.perf_counter() - started_at
    return {"tokens_per_second": sum(r[2] for r in runs) / wall, "ttft_seconds": statistics.median(r[0] for r in runs)}


def tool_responses() -> list[str]:
    """What the environment appends after turns 1-3: search snippets, then two pages."""
    documents = [json.loads(line) for line in SAMPLE_CORPUS.read_text().splitlines() if line.strip()]
    listing = "\n".join(f"{i}. {d['title']} (id: {d['id']})\n    {d['text'][:160]}" for i, d in enumerate(documents[:5], 1))
    pages = ["\n\n".join(f"{d['title']}\n{d['text']}" for d in documents[start : start + 8]) for start in (5, 13)]
    return [a2fm.tool_response([("1", text)]) for text in (listing, *pages)]


async def episode(url: str, query: str) -> dict:
    """Runs the 4 model calls of an agentic episode; returns their total and per-turn seconds."""
    transcript = a2fm.episode_prefix(Mode.MODE_AGENTIC, "This question needs tools to answer reliably.") + prompts.AGENTIC_OPENER
    responses, turns = tool_responses(), []
    async with PolicyClient(url, "smollm2", timeout=600, retries=0) as client:
        for turn in range(4):
            started_at = time.perf_counter()
            text, usage = "", None
            async for chunk in client.stream_chat(
                prompts.messages(query, transcript), max_tokens=TURN_TOKENS, temperature=0, stop=TURN_STOPS,
                continue_final_message=True, add_generation_prompt=False,
            ):
                text += chunk.text
                usage = chunk.usage or usage
            turns.append({"seconds": time.perf_counter() - started_at, "prompt_tokens": usage.prompt_tokens,
                          "completion_tokens": usage.completion_tokens})
            closing = "</tool_call>\n" if text.count("<tool_call>") > text.count("</tool_call>") else "\n"
            transcript += text + closing + (responses[turn] if turn < 3 else "")
    return {"seconds": sum(t["seconds"] for t in turns), "turns": turns}


async def switch_in_flight(url: str, copy: Path) -> dict:
    """POST /v1/load while a generation streams; whether that generation kept the old weights."""
    async with PolicyClient(url, "smollm2", timeout=600, retries=0) as client:
        prompt, greedy = "The history of Rome", {"max_tokens": 32, "temperature": 0, "ignore_eos": True}
        reference = (await client.complete(prompt, **greedy)).text
        stream = client.stream(prompt, **greedy)
        pieces = [(await anext(stream)).text]
        report = await client.load(str(copy))
        pieces += [chunk.text async for chunk in stream]
    return report | {"in_flight_text_unchanged": "".join(pieces) == reference}


def expand_gguf(models_dir: Path) -> dict:
    started_at = time.perf_counter()
    subprocess.run([sys.executable, "-c", EXPAND, str(models_dir)], check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    return {"gguf_to_cache_seconds": round(time.perf_counter() - started_at, 2)}


# The run


@dataclass
class Samples:
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(value)

    def medians(self) -> dict[str, float]:
        return {key: round(statistics.median(values), 3) for key, values in self.values.items()}


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {message}", file=sys.stderr, flush=True)


def rotated(servers: list[Server], by: int) -> list[Server]:
    by %= len(servers)
    return servers[by:] + servers[:by]


async def measure(servers: list[Server], rounds: int, tokens: int) -> dict:
    samples, episodes = Samples(), {}
    for server in servers:  # warm-up: first requests pay one-off costs (allocations, kernels)
        await throughput(server.url, 2, 8, -1)
    for round_index in range(rounds):
        for concurrency in CONCURRENCY:
            for server in rotated(servers, round_index + concurrency):
                await asyncio.sleep(SETTLE_SECONDS)
                figures = await throughput(server.url, concurrency, tokens, round_index)
                samples.add(f"{server.name}/c{concurrency}/tokens_per_second", figures["tokens_per_second"])
                samples.add(f"{server.name}/c{concurrency}/ttft_seconds", figures["ttft_seconds"])
                progress(f"round {round_index} {server.name} c{concurrency}: {figures['tokens_per_second']:.1f} tok/s")
        for server in rotated(servers, round_index):
            await asyncio.sleep(SETTLE_SECONDS)
            run = await episode(server.url, EPISODE_QUERIES[round_index % len(EPISODE_QUERIES)])
            samples.add(f"{server.name}/episode_seconds", run["seconds"])
            episodes.setdefault(server.name, []).append(run["turns"])
            progress(f"round {round_index} {server.name} episode: {run['seconds']:.1f} s")
    return {"medians": samples.medians(), "samples": samples.values, "episode_turns": episodes}


def ratios(samples: dict[str, list[float]], names: list[str]) -> dict[str, dict]:
    """Each ratio of the median figures, and per round: a round measures both moments apart, so
    its ratio moves less with the machine's load than either figure does."""
    pairs = {
        "builtin_vs_unbatched_c1": ("builtin/c1/tokens_per_second", "builtin-unbatched/c1/tokens_per_second"),
        "builtin_vs_unbatched_c8": ("builtin/c8/tokens_per_second", "builtin-unbatched/c8/tokens_per_second"),
        "episode_speedup_prefix_cache": ("builtin-unbatched/episode_seconds", "builtin/episode_seconds"),
    }
    if "vllm" in names:
        pairs |= {f"builtin_vs_vllm_c{c}": (f"builtin/c{c}/tokens_per_second", f"vllm/c{c}/tokens_per_second") for c in CONCURRENCY}
    return {
        name: {
            "of_medians": round(statistics.median(samples[a]) / statistics.median(samples[b]), 2),
            "per_round": [round(x / y, 2) for x, y in zip(samples[a], samples[b])],
        }
        for name, (a, b) in pairs.items()
        if a in samples and b in samples
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every measurement (medians are quoted)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per streamed completion")
    parser.add_argument("--threads", type=int, default=2, help="threads per server (torch / vLLM OpenMP)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weights' dtype, every server")
    parser.add_argument("--sleep-wait", action="store_true", help="built-in servers with spin_wait false (OpenMP threads sleep)")
    parser.add_argument("--busy", type=int, default=0, help="busy-looping processes beside the servers while measuring")
    parser.add_argument("--no-vllm", action="store_true", help="measure the built-in server only")
    parser.add_argument("--gguf", action="store_true", help="also time expanding the GGUF to safetensors")
    args = parser.parse_args()
    checkpoint = weights.cache_smollm2(Settings().data_dir / "models")
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-") as scratch:
        scratch = Path(scratch)
        expansion = expand_gguf(scratch / "models") if args.gguf else {}
        servers = [
            builtin("builtin", checkpoint, scratch, BASE_PORT, args.threads, args.dtype, spin_wait=not args.sleep_wait),
            builtin(
                "builtin-unbatched", checkpoint, scratch, BASE_PORT + 1, args.threads, args.dtype,
                max_batch_size=1, prefix_cache_mib=0, spin_wait=not args.sleep_wait,
            ),
        ]
        if not args.no_vllm:
            servers.append(vllm(checkpoint, BASE_PORT + 2, args.threads, args.dtype))
        with started(servers, scratch), busy(args.busy):
            figures = expansion | asyncio.run(measure(servers, args.rounds, args.tokens))
            copy = shutil.copytree(checkpoint, scratch / "checkpoint-copy")
            figures["switch"] = asyncio.run(switch_in_flight(servers[0].url, copy))
            figures["peak_rss_mib"] = {server.name: server.peak_rss_mib() for server in servers}
    figures["ratios"] = ratios(figures["samples"], [server.name for server in servers])
    figures["load_average_1min"] = round(os.getloadavg()[0], 2)
    figures["cpus"] = os.cpu_count()
    figures["busy_processes"] = args.busy
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
