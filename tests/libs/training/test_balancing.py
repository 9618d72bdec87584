"""An MoE's balancing loss per sequence: transformers' Switch loss for one sequence and one layer,
a sum over the sequences of a batch however it is padded, packed or shares a prefix."""

import pytest
import torch
from gearshift.training import forward
from gearshift.training.balancing import RouterLoad
from gearshift.training.batching import pack, plan
from gearshift.training.tokenization import PREFIX, Encoded
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func


def test_one_sequence_of_one_layer_is_transformers_switch_loss():
    torch.manual_seed(0)
    logits = torch.randn(9, 4) * 3
    load = RouterLoad(experts=4, top_k=2)
    load.add((logits,), torch.ones(9, 1))
    assert float(load.loss_sum()) == pytest.approx(float(load_balancing_loss_func((logits,), 4, 2)), rel=1e-6)
    assert load.expert_tokens().sum() == 9 * 2  # each token counted once per expert it went to


def test_a_collapsed_router_costs_more_and_shows_in_the_counts():
    balanced, collapsed = RouterLoad(4, 2), RouterLoad(4, 2)
    balanced.add((torch.eye(4).repeat(2, 1) * 5,), torch.ones(8, 1))
    collapsed.add((torch.tensor([[5.0, 4.0, 0.0, 0.0]]).repeat(8, 1),), torch.ones(8, 1))
    assert float(collapsed.loss_sum()) > 1.5 * float(balanced.loss_sum())
    assert collapsed.expert_tokens().tolist() == [[8, 8, 0, 0]]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from gearshift.training.tiny import tiny_moe_checkpoint
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_moe_checkpoint(tmp_path_factory.mktemp("moe") / "moe"), dtype=torch.float32)
    return forward.TargetForward(model)


def _examples(prefix: list[int], tails: list[list[int]]) -> list[Encoded]:
    return [Encoded(prefix + tail, [False] * len(prefix) + [True] * len(tail)) for tail in tails]


def _routed(module, micro) -> tuple[float, list]:
    out = forward.through(module, micro.batch, micro.share_prefix)
    return float(out.router_loss.detach()), out.expert_tokens.tolist()


def test_the_batch_loss_is_the_sum_of_each_sequence_alone_padded_packed_or_sharing_a_prefix(moe):
    prefix = list(range(40, 240))  # long enough that decoding it once pays (forward.MIN_TOKENS_SAVED)
    examples = _examples(prefix, [[5, 6], [8, 9, 10], list(range(10, 22))])  # two short tails fit one packed row
    alone = [_routed(moe, plan([example], 0, 0)[0]) for example in examples]
    padded = plan(examples, 0, 0)[0]
    assert forward.shared_prefix(padded.batch) > 0  # the prefix decoded once, counted in every sequence
    (packed,) = pack(examples, 0, 0, share_prefix=True)
    assert len(packed.batch.input_ids) == 1 and int((packed.batch.sequence_ids == PREFIX).sum()) == len(prefix) - 1  # one row, the prefix once
    for micro in (padded, packed):
        loss, counts = _routed(moe, micro)
        assert loss == pytest.approx(sum(one for one, _ in alone), rel=1e-5)
        assert counts == [[sum(c) for c in zip(*per_layer)] for per_layer in zip(*(counts for _, counts in alone))]
