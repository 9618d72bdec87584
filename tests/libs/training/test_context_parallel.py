"""Ulysses context parallelism (training/context_parallel.py) gives one process's loss and
gradients: real gloo ranks as processes, each holding a slice of one packed micro-batch of a few
thousand tokens (three sequences continuing a shared prefix), against the same forward and
backward in one process on the whole pack. A tiny Llama (grouped-query attention: its 2 key-value
heads are repeated where 4 ranks split them) and a tiny Qwen3-MoE with its balancing loss, whose
per-sequence counts the group sums."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
import torch

from tests.rank_processes import rank_context

pytestmark = [pytest.mark.slow("ranks as processes, a few thousand tokens each way"), pytest.mark.ranks]

LENGTHS = (1400, 900, 650)  # after the shared prefix
PREFIX = 300
VOCAB = 512


def tiny_model(arch: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    if arch == "llama":
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=4096)
        return LlamaForCausalLM(config)
    config = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                            max_position_embeddings=4096, router_aux_loss_coef=0.01)
    return Qwen3MoeForCausalLM(config)


def packed_batch():
    from gearshift.training import batching
    from gearshift.training.tokenization import Encoded

    draw = random.Random(1)
    prefix = [draw.randrange(VOCAB) for _ in range(PREFIX)]
    examples = []
    for length in LENGTHS:
        rest = [draw.randrange(VOCAB) for _ in range(length)]
        examples.append(Encoded(prefix + rest, [False] * (PREFIX + 20) + [draw.random() < 0.7 for _ in range(length - 20)]))
    (micro,) = batching.pack(examples, 0, 0)
    assert micro.batch.input_ids.shape[1] == PREFIX + sum(LENGTHS)  # the prefix once
    return micro


def loss_and_gradients(arch: str, context) -> tuple[float, dict[str, torch.Tensor]]:
    """The SFT loss of the pack (a token mean), plus the MoE's balancing loss, and its gradients;
    with context, this rank's share of both."""
    from gearshift.training import forward

    model = tiny_model(arch)
    module = forward.TargetForward(model, chunk_tokens=256, context=context)
    micro = packed_batch()
    targets = int(forward.target_positions(micro.batch)[0].numel())
    out = forward.through(module, micro.batch)
    loss = -out.logprobs.sum() / targets
    if out.router_loss is not None:
        loss = loss + model.config.router_aux_loss_coef * out.router_loss / len(LENGTHS)
    loss.backward()
    return float(loss), {name: param.grad for name, param in model.named_parameters()}


def rank_main(rank: int, world: int, arch: str, store_path: str, results) -> None:
    import torch.distributed as dist
    from gearshift.training.config import RuntimeConfig
    from gearshift.training.context_parallel import context_of
    from gearshift.training.distributed import Ranks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world, timeout=timedelta(seconds=120))
    context = context_of(Ranks(rank, world), RuntimeConfig(context_parallel=world))
    loss, grads = loss_and_gradients(arch, context)
    total = torch.tensor([loss], dtype=torch.float64)
    dist.all_reduce(total)
    for grad in grads.values():
        dist.all_reduce(grad)
    if rank == 0:
        alone_loss, alone_grads = loss_and_gradients(arch, None)
        worst = max(float((grads[name] - alone_grads[name]).abs().max() / alone_grads[name].abs().max().clamp(min=1e-12))
                    for name in alone_grads)
        results.put((float(total), alone_loss, worst))
    dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch, world", [("llama", 2), ("llama", 4), ("moe", 2), ("moe", 4)])
def test_ulysses_gives_one_process_loss_and_gradients(tmp_path, arch, world):
    context = rank_context(__name__)
    results = context.Queue()
    processes = [context.Process(target=rank_main, args=(rank, world, arch, str(tmp_path / "store"), results)) for rank in range(world)]
    for process in processes:
        process.start()
    split_loss, alone_loss, worst = results.get(timeout=240)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert split_loss == pytest.approx(alone_loss, rel=1e-5)
    assert worst < 1e-4  # the largest gradient difference, relative to the parameter's largest gradient


def test_context_parallel_is_refused_where_it_cannot_split():
    from gearshift.training.config import RuntimeConfig
    from gearshift.training.forward import TargetForward, check_context_parallel as check

    model = TargetForward(tiny_model("llama")).model
    with pytest.raises(ValueError, match="does not divide the 4 attention heads a rank holds"):
        check(model, RuntimeConfig(context_parallel=3))
    with pytest.raises(ValueError, match="set runtime.packing true"):
        check(model, RuntimeConfig(context_parallel=2, packing=False))
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="runs on the sdpa attention"):
        check(model, RuntimeConfig(context_parallel=2))
