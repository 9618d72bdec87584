"""SFT with context parallelism as users launch it (`torchrun -m gearshift.cli train sft`, the
store's trajectories): agentic episodes of about 6,000 tokens that the executor ran (a scripted
policy whose python call prints a long table), learned at 2 ranks with `runtime.context_parallel: 2` as in one process, with
each rank's peak resident memory well below the one process's."""

from __future__ import annotations

import json

import pytest
from gearshift.api.common.v1.common_pb2 import Mode, Purpose
from gearshift.api.executor.v1 import executor_pb2, executor_pb2_grpc
from gearshift.clients import channel
from gearshift.embedded import embedded
from gearshift.protocol.sr2am import PLAN_HEAD
from gearshift.testing.scripted_policy import serve_scripted
from gearshift.topology import SERVICE_NAMES

from tests.jobs.rank_runs import first_error, launch, metrics, write_config
from tests.jobs.test_load_memory import JEMALLOC

pytestmark = [pytest.mark.slow("two SFT runs on 6,000-token episodes"), pytest.mark.ranks]

LINES = 190  # of the tool's printout: about 6,000 tokens an episode
MAX_RATIO = 0.8  # a rank's peak at context_parallel 2 over one process's: measured 0.69 (1,522 MiB against 2,195)
CODE = f"for i in range(1, {LINES}): print(f'37 times {{i}} is {{37 * i}}, and 23 times {{i}} is {{23 * i}}')"


def long_printout(body: dict) -> str:
    """Routes to tools, has python print a long table, and answers from it: an agentic
    trajectory most of whose tokens are tool output (masked out of the loss, but attended to)."""
    last = body["messages"][-1]["content"]
    if "</classification>" in (body.get("stop") or []):
        return "A table helps.\n<classification>\ntoolcalling_agent\n</classification>"
    if last.startswith("You regulate"):
        return "ACT"
    if last.endswith(PLAN_HEAD):
        return " None"
    if "<tool_response>" in last:
        return "The table shows 37 times 23.\n<answer>851</answer>"
    call = {"id": 1, "name": "python", "arguments": {"code": CODE}}
    return f"Print the table.</plan>\n<tool_call>\n{call}\n</tool_call>"


@pytest.fixture(scope="module")
async def long_episodes(store, tmp_path_factory) -> str:
    """Two such episodes, scored and stored (task_source "long"), the episode and tool output
    budgets raised to hold them."""
    from gearshift.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("platform"), metrics_port=0, store_addr=store.address, log_level="WARNING")
    settings = settings.model_copy(update={"executor": settings.executor.model_copy(update={"max_tokens": 100_000}),
                                           "sandbox": settings.sandbox.model_copy(update={"max_output_chars": 100_000})})
    async with serve_scripted(long_printout) as url:
        services = tuple(name for name in SERVICE_NAMES if name != "store")
        async with embedded(settings.with_policy(url), services) as running:
            async with channel(running.settings.executor_addr, running.settings) as ch:
                stub = executor_pb2_grpc.ExecutorStub(ch)
                for _ in range(2):
                    request = executor_pb2.SolveRequest(query="What is 37*23?", mode=Mode.MODE_AGENTIC, reference_answer="851",
                                                        task_source="long", split="train", purpose=Purpose.PURPOSE_TRAINING)
                    [item async for item in stub.Solve(request)]
    return "long"


@pytest.fixture(scope="module")
def wide_llama(tiny_dir, tmp_path_factory):
    """A random Llama whose activations at 6,000 tokens outweigh what a process holds anyway
    (6 layers, hidden 512, 8 heads), with the tiny model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("wide-llama")
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1408, num_hidden_layers=6, num_attention_heads=8,
                         num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train(ranks: int, model, store, folder, context_parallel: int) -> list[dict]:
    body = {"model": {"base": str(model)}, "store_addr": store.address, "batch_size": 1,
            "data": {"task_source": "long", "correctness": "correct"}, "max_length": 8192,
            "optim": {"learning_rate": 1e-4, "max_steps": 1, "threads": 1},
            "runtime": {"context_parallel": context_parallel, "micro_batch_tokens": 8192},
            "output": {"dir": str(folder / "out"), "progress": False, "register_checkpoint": False}}
    folder.mkdir(parents=True)
    config = write_config(folder / "sft.json", body)
    done = launch(ranks, "-m", "gearshift.cli", "train", "sft", "--config", str(config), env={"LD_PRELOAD": JEMALLOC})
    assert done.returncode == 0, first_error(done.stderr)
    return metrics(folder / "out")


def test_sft_at_context_parallel_two_learns_what_one_process_learns_in_less_memory_a_rank(wide_llama, store, long_episodes, tmp_path):
    alone = train(1, wide_llama, store, tmp_path / "one", 1)
    split = train(2, wide_llama, store, tmp_path / "two", 2)
    assert 5_000 < alone[0]["tokens"] < 7_000  # an episode of about 6,000 tokens, not cut
    assert split[0]["loss"] == pytest.approx(alone[0]["loss"], rel=1e-5)
    assert split[0]["grad_norm"] == pytest.approx(alone[0]["grad_norm"], rel=1e-4)
    ratio = split[0]["peak_rss_mib"] / alone[0]["peak_rss_mib"]
    print(json.dumps({"one_process_mib": alone[0]["peak_rss_mib"], "context_parallel_2_mib": split[0]["peak_rss_mib"], "ratio": ratio}))
    assert ratio < MAX_RATIO
