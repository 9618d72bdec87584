"""Packed micro-batches are the padded ones' computation without the padding: every example whole
in one row, its position ids restarting, attention kept inside it (and its row's shared prefix);
the same log-probabilities, KL and gradients as padded rows (SFT, APO rollouts sharing a prompt,
distillation against a teacher). And a step's examples split over ranks by tokens."""

from __future__ import annotations

import random

import pytest
import torch
from gearshift.training import batching, forward, tokenization
from gearshift.training.distributed import Ranks
from gearshift.training.tiny import tiny_checkpoint
from transformers import AutoModelForCausalLM

from tests.libs.training.trajectories import forced_agentic, routed_instant

# float32 on the CPU: packed and padded rows sum the same terms in another order (another
# attention width, the head's chunks): measured differences up to 2e-6 in log-probabilities.
ATOL = 1e-5
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4


def synthetic(lengths: list[int]) -> list[tokenization.Encoded]:
    """Examples of these lengths, token ids distinct per example, the second half of each learned."""
    return [tokenization.Encoded([100 * i + t for t in range(n)], [t >= n // 2 for t in range(n)]) for i, n in enumerate(lengths)]


def test_packing_keeps_every_example_whole_with_its_positions_within_the_bound():
    examples = synthetic([30, 5, 12, 12, 60, 7, 29, 3, 40])
    plan = batching.pack(examples, 128, pad_id=0)
    assert sorted(i for micro in plan for i in micro.indices) == list(range(len(examples)))
    assert all(micro.batch.input_ids.numel() <= 128 for micro in plan)
    for micro in plan:
        batch = micro.batch
        for row, index in enumerate(micro.indices):
            at = batch.sequence_ids == row
            assert int(at.any(dim=1).sum()) == 1  # one row holds it, contiguous, in order
            assert batch.input_ids[at].tolist() == examples[index].input_ids
            assert batch.position_ids[at].tolist() == list(range(len(examples[index].input_ids)))
            assert batch.target_mask[at].tolist() == examples[index].target
        assert batch.tokens == sum(len(examples[i].input_ids) for i in micro.indices)
    padded = batching.plan(examples, 128, pad_id=0)
    # 198 tokens: padded rows compute 2 x 60 + 4 x 30 + 3 x 7 = 261 in 3 forwards, packed ones the 198 alone in 2 rows
    assert [m.batch.input_ids.shape[0] for m in plan] == [1, 1]
    assert sum(m.batch.input_ids.numel() for m in plan) == 198 < sum(m.batch.input_ids.numel() for m in padded) == 261
    assert len(plan) == 2 < len(padded) == 3
    assert len(batching.pack(synthetic([100]), 64, pad_id=0)) == 1  # too long: alone


def test_a_shared_prefix_is_held_once_per_micro_batch_and_only_where_it_saves_enough():
    prefix = list(range(1000, 1000 + forward.MIN_TOKENS_SAVED))
    examples = [tokenization.Encoded(prefix + [7] * n, [False] * len(prefix) + [True] * n) for n in (40, 10, 20, 5)]
    (micro,) = batching.pack(examples, 0, pad_id=0)
    assert micro.share_prefix and batching.common_prefix(examples) == len(prefix) - 1  # the last prefix token predicts a target
    batch = micro.batch
    shared = len(prefix) - 1
    assert batch.input_ids.shape == (1, shared + sum(len(e.input_ids) - shared for e in examples))  # [prefix, 41, 21, 11, 6]
    assert int((batch.sequence_ids == tokenization.PREFIX).sum()) == shared
    for row, example in enumerate(examples):
        at = batch.sequence_ids == row
        assert batch.position_ids[at].tolist() == list(range(len(prefix) - 1, len(example.input_ids)))
    few = batching.pack(examples[:2], 0, pad_id=0)[0]  # two examples: the prefix once saves 127 tokens, under 128
    assert not few.share_prefix and not (few.batch.sequence_ids == tokenization.PREFIX).any()


@pytest.fixture(scope="module")
def model(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)


def sft_examples(tokenizer) -> list[tokenization.Encoded]:
    """An agentic episode and short chats, each with its own prompt: three pack into one row."""
    short = [tokenization.encode_pieces(tokenizer, [tokenization.Segment(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n", False),
                                                   tokenization.Segment(answer, True)])
             for question, answer in (("What is 2+2?", "4, of course.<|im_end|>"), ("Name a colour.", "Blue<|im_end|>"),
                                      ("Capital of Italy?", "Rome is the capital of Italy.<|im_end|>"))]
    return [short[0], tokenization.encode_trajectory(tokenizer, forced_agentic(), 1024, True), *short[1:]]


def group(tokenizer) -> list[tokenization.Encoded]:
    """APO rollouts of one prompt: the prompt (system prompt and query) shared, rests of 25 to 117 tokens."""
    rollouts = [routed_instant(), forced_agentic(), routed_instant("x"), routed_instant("y")]
    for rollout in rollouts:
        rollout.query = "What is 17*23?"
    rollouts[2].turns[0].output = "391, as 17*23 = 17*20 + 17*3 = 340 + 51.</answer>"
    return [tokenization.encode_trajectory(tokenizer, t, 1024, True) for t in rollouts]


def values_and_grads(model, micro: batching.MicroBatch, loss_of) -> tuple[forward.Targets, list[torch.Tensor]]:
    model.zero_grad()
    out = forward.through(forward.TargetForward(model), micro.batch, micro.share_prefix)
    loss_of(out).backward()
    return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_same(packed: tuple[forward.Targets, list], padded: tuple[forward.Targets, list], field: str = "logprobs"):
    (out, grads), (reference, reference_grads) = packed, padded
    assert torch.equal(out.rows, reference.rows) and torch.equal(out.columns, reference.columns)
    assert torch.equal(out.tokens, reference.tokens)
    assert torch.allclose(getattr(out, field), getattr(reference, field), atol=ATOL)
    assert len(grads) == len(reference_grads) > 0
    assert all(torch.allclose(a, b, atol=GRAD_ATOL, rtol=GRAD_RTOL) for a, b in zip(grads, reference_grads))


def weighted(values: torch.Tensor, out: forward.Targets) -> torch.Tensor:
    """A loss that tells the rows apart (as advantages do): a wrong row mapping changes its gradient."""
    return -(values * (1.0 + out.rows.float())).sum()


def test_packed_sft_batches_give_the_padded_logprobs_and_gradients(model, tokenizer):
    examples = sft_examples(tokenizer)
    (packed,) = batching.pack(examples, 0, tokenizer.eos_token_id)
    assert not packed.share_prefix and packed.batch.input_ids.shape[0] == 1  # every chat in one row
    (padded,) = batching.plan(examples, 0, tokenizer.eos_token_id)
    assert packed.indices == padded.indices == [0, 1, 2, 3]
    padded.share_prefix = False
    loss = lambda out: weighted(out.logprobs, out)  # noqa: E731
    assert_same(values_and_grads(model, packed, loss), values_and_grads(model, padded, loss))


def test_packed_rollouts_sharing_a_prompt_give_the_padded_logprobs_and_gradients(model, tokenizer):
    examples = group(tokenizer)
    (packed,) = batching.pack(examples, 0, tokenizer.eos_token_id)
    assert packed.share_prefix and packed.batch.input_ids.shape[0] == 1  # [prompt, 117, 47, 25, 25]
    (whole,) = batching.plan(examples, 0, tokenizer.eos_token_id)
    whole.share_prefix = False
    loss = lambda out: weighted(out.logprobs, out)  # noqa: E731
    assert_same(values_and_grads(model, packed, loss), values_and_grads(model, whole, loss))


def test_packed_distillation_gives_the_padded_kl_and_gradients(model, tokenizer, tmp_path):
    teacher = forward.TargetForward(AutoModelForCausalLM.from_pretrained(tiny_checkpoint(tmp_path / "teacher", seed=1), dtype=torch.float32))
    examples = group(tokenizer)

    (packed,) = batching.pack(examples, 0, tokenizer.eos_token_id)
    (padded,) = batching.plan(examples, 0, tokenizer.eos_token_id)
    padded.share_prefix = False
    assert packed.batch.packed and packed.select([0, 1, 3]).batch.packed

    def with_teacher(micro):
        rows = [0, 1, 3]
        with torch.no_grad():
            hidden = forward.through(teacher, micro.select(rows, share_prefix=micro.share_prefix).batch, hidden_only=True).hidden
        target_rows, _ = forward.target_positions(micro.batch)
        view = forward.Teacher(torch.isin(target_rows, torch.tensor(rows)).nonzero().squeeze(-1), hidden, forward.whole_weight(teacher.head))
        model.zero_grad()
        out = forward.through(forward.TargetForward(model), micro.batch, micro.share_prefix, teachers=(view,))
        out.kl.sum().backward()
        return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    packed_out = with_teacher(packed)
    assert (packed_out[0].kl[packed_out[0].rows == 2] == 0).all() and (packed_out[0].kl > 0).sum() > 50
    assert_same(packed_out, with_teacher(padded), "kl")


def test_balance_spreads_tokens_evenly_and_the_same_on_every_rank():
    draw = random.Random(0)
    tokens = [draw.randint(50, 4000) for _ in range(64)]
    for ranks in (2, 4, 8):
        shares = batching.balance(tokens, ranks)
        assert sorted(i for share in shares for i in share) == list(range(len(tokens)))
        loads = [sum(tokens[i] for i in share) for share in shares]
        assert max(loads) - min(loads) <= max(tokens)  # greedy longest-first: within one item
        by_count = [sum(tokens[(len(tokens) * r) // ranks:(len(tokens) * (r + 1)) // ranks]) for r in range(ranks)]
        assert max(loads) - min(loads) < (max(by_count) - min(by_count)) / 4
        assert shares == batching.balance(list(tokens), ranks)
    items = [f"item{i}" for i in range(len(tokens))]
    mine = [batching.balanced(Ranks(rank=r, world_size=4), items, lambda item: tokens[items.index(item)]) for r in range(4)]
    assert [[items.index(item) for item in share] for share in mine] == batching.balance(tokens, 4)
