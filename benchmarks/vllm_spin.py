"""A vLLM CPU server of the tests (tests/vllm_servers.py) with its message queues spinning, as
vLLM ships them, against polling every half millisecond (tests/vllm_site/vllm_no_spin.py), side
by side:

    .venv/bin/python benchmarks/vllm_spin.py [--requests 3]

One server at a time, each with the suite's flags and its LoRA ops; each request is a 241-token
prompt and 128 greedy tokens on the default policy's adapter. Prints the median wall seconds and
the CPU seconds of the engine core and the worker per request, and the ratios."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parents[1]))
from gearshift import weights  # noqa: E402
from gearshift.settings import Settings  # noqa: E402

from tests.test_vllm_idle import ENGINE_CORE, WORKER, cpu_seconds  # noqa: E402
from tests.vllm_servers import running_vllm_servers, vllm_site  # noqa: E402

PROMPT = "Write a long story about a dragon who learns to code. " * 20
BODY = {"model": weights.DEFAULT, "prompt": PROMPT, "max_tokens": 128, "temperature": 0, "ignore_eos": True}


def measure(site: str, requests: int) -> dict[str, float]:
    """Median wall and CPU seconds per request of a server whose processes import site first."""
    with tempfile.TemporaryDirectory() as logs, \
            running_vllm_servers(1, weights.cache_smollm2(Settings().models_dir), Path(logs), site) as servers:
        runs = [request(servers.urls[0], {servers.processes[0].pid}) for _ in range(requests)]
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


def request(url: str, group: set[int]) -> dict[str, float]:
    names = (ENGINE_CORE, WORKER)
    before = {name: cpu_seconds(group, name) for name in names}
    started = time.monotonic()
    httpx.post(f"{url}/completions", json=BODY, timeout=600).raise_for_status()
    wall = time.monotonic() - started
    return {"wall_s": wall, **{f"{name}_cpu_s": cpu_seconds(group, name) - before[name] for name in names}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3)
    requests = parser.parse_args().requests
    with tempfile.TemporaryDirectory() as spinning:  # the same LoRA ops, vLLM's own queues
        (Path(spinning) / "sitecustomize.py").write_text("import vllm_cpu_lora\nvllm_cpu_lora.install()\n")
        before = measure(os.pathsep.join([spinning, str(vllm_site())]), requests)
    after = measure(str(vllm_site()), requests)
    print(f"{'':24} {'spinning':>10} {'polling':>10} {'ratio':>7}")
    for name in before:
        print(f"{name:24} {before[name]:10.2f} {after[name]:10.2f} {after[name] / before[name]:7.2f}")


if __name__ == "__main__":
    main()
