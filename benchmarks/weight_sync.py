"""Weight sync against a training step, in one run on this machine (not a timed test).

What an on-policy job (APO, distillation) with a running executor pays after each update to make
the policy server sample the new weights (gearshift.training.on_policy.RemotePolicy), beside the time
of one training step of the same model, SmolLM2-135M in float32:

- lora/vllm: save the adapter alone, vLLM serves it under the step's new name and unloads the
  previous one (/v1/load_lora_adapter, /v1/unload_lora_adapter), then the first request on the
  new name (one token; the client follows the alias, as the executor's does);
- full/builtin: save the checkpoint, the built-in server loads it (POST /v1/load), first request;
- full/vllm: save the checkpoint, vLLM reloads it in place (/collective_rpc reload_weights and
  /reset_prefix_cache; VLLM_SERVER_DEV_MODE=1), first request;
- the training steps: gearshift's step (accumulate, clip, AdamW) on 4 x 128 tokens, LoRA and full.

Each figure is the median of --rounds repetitions; the first of each kind is a warm-up, not
counted. vLLM runs as tests/vllm_servers.py starts it (its CPU build, --enforce-eager).

    .venv/bin/python benchmarks/weight_sync.py [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.vllm_servers: the one vLLM launcher

import torch  # noqa: E402
from gearshift import weights  # noqa: E402
from gearshift.training import on_policy  # noqa: E402
from gearshift.jobs.apo.config import APOConfig  # noqa: E402
from gearshift.policy_client import PolicyClient  # noqa: E402
from gearshift.services.policy_server.server import running  # noqa: E402
from gearshift.settings import PolicyServerSettings, Settings  # noqa: E402
from gearshift.training import losses, tokenization  # noqa: E402
from gearshift.training.runtime import Run  # noqa: E402

from tests.vllm_servers import running_vllm_servers  # noqa: E402

ALIAS = on_policy.SERVED_NAME
PROMPT = "The capital of France is"
ROWS, TOKENS = 4, 128


def run_of(out: Path, lora: bool, threads: int) -> Run:
    config = APOConfig.model_validate({
        "model": {"base": "smollm2", "lora": lora},
        "optim": {"max_steps": 100, "threads": threads, "learning_rate": 1e-4},
        "output": {"dir": str(out), "progress": False},
        "prompts": [{"query": "q", "reference_answer": "a"}],
    })
    return Run.start("apo", config)


def training_step(run: Run) -> float:
    """Seconds of one optimizer step on ROWS x TOKENS tokens, the last three quarters learned."""
    generator = torch.Generator().manual_seed(run.step)
    examples = [
        tokenization.Encoded(torch.randint(100, 40000, (TOKENS,), generator=generator).tolist(), [i >= TOKENS // 4 for i in range(TOKENS)])
        for _ in range(ROWS)
    ]
    targets = sum(e.target_count for e in examples)
    started = time.perf_counter()
    run.accumulate(run.micro_batches(examples), lambda micro, out: -losses.token_logprobs(out.logits, out.tokens).sum() / targets)
    run.optimize()
    run.step += 1
    return time.perf_counter() - started


async def first_token(policy: PolicyClient) -> float:
    started = time.perf_counter()
    await policy.complete(PROMPT, max_tokens=1)
    return time.perf_counter() - started


async def lora_sync(run: Run, server: on_policy.RemotePolicy, policy: PolicyClient, step: int) -> dict:
    """The LoRA route's parts, as RemotePolicy.publish runs them, then the first request."""
    directory = run.output / on_policy.SERVING_DIR / f"{on_policy.ADAPTER_PREFIX}{step:08d}"
    started = time.perf_counter()
    on_policy.save_adapter(run, directory)
    saved = time.perf_counter()
    await server.client.serve_adapter(ALIAS, step, str(directory.resolve()))
    served = time.perf_counter()
    on_policy.drop_other_adapters(directory)
    first = await first_token(policy)
    return {"save": saved - started, "load": served - saved, "first request": first, "sync": time.perf_counter() - started}


async def full_sync(run: Run, server: on_policy.RemotePolicy, policy: PolicyClient, step: int) -> dict:
    serving = run.output / on_policy.SERVING_DIR
    started = time.perf_counter()
    run.save_weights(serving)
    saved = time.perf_counter()
    await server.client.switch_weights(str(serving.resolve()))
    loaded = time.perf_counter()
    first = await first_token(policy)
    return {"save": saved - started, "load": loaded - saved, "first request": first, "sync": time.perf_counter() - started}


def median_of(rounds: list[dict]) -> dict:
    counted = rounds[1:] or rounds  # the first round warms up
    return {key: statistics.median(r[key] for r in counted) for key in counted[0]}


async def measure(rounds: int, threads: int, vllm_url: str, work: Path) -> dict[str, dict]:
    smollm2 = weights.cache_smollm2(Settings().models_dir)
    builtin_settings = Settings(data_dir=work / "builtin", log_level="WARNING",
                                policy_server=PolicyServerSettings(port=0, model=str(smollm2), threads=threads))
    results: dict[str, dict] = {}
    lora = run_of(work / "lora", lora=True, threads=threads)
    lora_stack = Settings().with_policy(vllm_url, model=ALIAS)
    async with on_policy.remote_policy(lora, lora_stack) as server, PolicyClient(vllm_url, ALIAS) as policy:
        syncs = []
        for step in range(rounds + 1):
            steps = training_step(lora)
            syncs.append(await lora_sync(lora, server, policy, step) | {"training step": steps})
        results["lora -> vllm"] = median_of(syncs)
    del lora
    full = run_of(work / "full", lora=False, threads=threads)
    async with running(builtin_settings) as builtin:
        for name, url, model in (("full -> builtin", builtin.base_url, "smollm2"), ("full -> vllm", vllm_url, "smollm2")):
            async with on_policy.remote_policy(full, Settings().with_policy(url, model=model)) as server, PolicyClient(url, model) as policy:
                syncs = []
                for step in range(rounds + 1):
                    steps = training_step(full)
                    syncs.append(await full_sync(full, server, policy, step) | {"training step": steps})
                results[name] = median_of(syncs)
    return results


def table(results: dict[str, dict], rounds: int, threads: int) -> str:
    columns = ["save", "load", "first request", "sync", "training step"]
    lines = [
        f"weight sync per step vs a training step ({ROWS} x {TOKENS} tokens), SmolLM2-135M fp32, {threads} threads, "
        f"median of {rounds} rounds (seconds)",
        "| route | " + " | ".join(columns) + " | sync / step |",
        "|---|" + "---|" * (len(columns) + 1),
    ]
    for name, figures in results.items():
        cells = " | ".join(f"{figures[c]:.2f}" for c in columns)
        lines.append(f"| {name} | {cells} | {figures['sync'] / figures['training step']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed repetitions of each route (after one warm-up)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of training and the built-in server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weight-sync-") as work:
        root = Path(work)
        with running_vllm_servers(1, weights.cache_smollm2(Settings().models_dir), root / "vllm") as servers:
            (vllm_url,) = servers.urls
            results = asyncio.run(measure(args.rounds, args.threads, vllm_url, root))
    print(table(results, args.rounds, args.threads))
    print(f"\n.venv/bin/python benchmarks/weight_sync.py --rounds {args.rounds} --threads {args.threads}")


if __name__ == "__main__":
    main()
