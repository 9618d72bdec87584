"""Measures the built-in policy server with the real SmolLM2-135M-Instruct and prints JSON:

- gguf_to_cache_seconds: expanding the GGUF to safetensors once (a child process, fresh dir),
  with that child's peak RSS;
- cache_load_seconds: loading the cached checkpoint (what every later start costs);
- tokens_per_second: greedy decoding over HTTP (completions, ignore_eos), single stream;
- switch: POST /v1/load to a second local checkpoint directory while a generation is in
  flight, and whether that generation still finished with the old model's exact text;
- serving_peak_rss_mb: this process's peak RSS (server + both models during the switch).

    .venv/bin/python benchmarks/policy_server.py [--tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gearshift import weights
from gearshift.policy_client import PolicyClient
from gearshift.services.policy_server.server import running
from gearshift.settings import PolicyServerSettings, Settings

EXPAND = "import sys; from pathlib import Path; from gearshift.weights import cache_smollm2; cache_smollm2(Path(sys.argv[1]))"


def expand_gguf(models_dir: Path) -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", EXPAND, str(models_dir)], check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"gguf_to_cache_seconds": round(time.perf_counter() - started, 2), "gguf_child_peak_rss_mb": round(peak_kb / 1024)}


async def serve_and_measure(models_dir: Path, tokens: int, threads: int) -> dict:
    data_dir = models_dir.parent
    settings = Settings(data_dir=data_dir, log_level="WARNING", policy_server=PolicyServerSettings(port=0, threads=threads))
    second = data_dir / "checkpoint-copy"
    shutil.copytree(models_dir / weights.SMOLLM2_CACHE, second)
    async with running(settings) as server, PolicyClient(server.base_url, "smollm2", timeout=600) as client:
        figures = {"cache_load_seconds": round(server.engine.current.load_seconds, 2)}
        chat = await client.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=40)
        figures["capital_of_france"] = chat.content

        prompt, greedy = "The history of Rome", {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        started = time.perf_counter()
        reference = await client.complete(prompt, **greedy)
        figures["tokens_per_second"] = round(reference.usage.completion_tokens / (time.perf_counter() - started), 1)

        stream = client.stream(prompt, **greedy)
        pieces = [(await anext(stream)).text]
        report = await client.load(str(second))
        pieces += [chunk.text async for chunk in stream]
        figures["switch"] = report | {"in_flight_text_unchanged": "".join(pieces) == reference.text}
    figures["serving_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per timed generation")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-") as scratch:
        models_dir = Path(scratch) / "models"
        figures = expand_gguf(models_dir)
        figures |= asyncio.run(serve_and_measure(models_dir, args.tokens, args.threads))
    figures["load_average_1min"] = round(os.getloadavg()[0], 2)
    figures["cpus"] = os.cpu_count()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
