"""The shared-prefix forward pass is the same computation as decoding every row whole: equal
target log-probabilities and equal gradients, on rows of different lengths (right padding) decoded in two
halves by length."""

from __future__ import annotations

import pytest
import torch
from gearshift.training import batching, forward, tokenization
from transformers import AutoModelForCausalLM

from tests.libs.training.trajectories import forced_agentic, routed_instant


@pytest.fixture
def batch(tokenizer) -> tokenization.Batch:
    examples = [tokenization.encode_trajectory(tokenizer, t, 1024, True) for t in (routed_instant(), forced_agentic(), routed_instant("x"))]
    return tokenization.collate(examples, tokenizer.eos_token_id)


def loss_and_grads(model, batch) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    logprobs = forward.through(forward.TargetForward(model), batch).logprobs
    loss = -logprobs.mean()
    loss.backward()
    return logprobs.detach(), loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_the_shared_prefix_is_decoded_once_with_the_same_logits_and_gradients(tiny_dir, batch, monkeypatch):
    shared = forward.shared_prefix(batch)
    assert shared * 2 >= forward.MIN_TOKENS_SAVED and not forward._predicting(batch)[:, :shared].any()
    assert batch.attention_mask.min() == 0  # rows of different lengths: the shorter ones are padded
    assert forward.length_halves(batch.attention_mask.sum(dim=1).tolist()) == [[1], [0, 2]]  # the agentic row apart
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    logprobs, loss, grads = loss_and_grads(model, batch)
    monkeypatch.setattr(forward, "MIN_TOKENS_SAVED", 10**9)  # every row decoded whole
    assert forward.shared_prefix(batch) == 0
    whole_logprobs, whole_loss, whole_grads = loss_and_grads(model, batch)
    assert torch.allclose(logprobs, whole_logprobs, atol=1e-5) and torch.allclose(loss, whole_loss, atol=1e-6)
    assert len(grads) == len(whole_grads) > 0
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(grads, whole_grads))


def test_no_prefix_is_shared_by_one_row_or_rows_that_differ_early(tokenizer):
    one = tokenization.collate([tokenization.encode_trajectory(tokenizer, routed_instant(), 1024, True)], tokenizer.eos_token_id)
    assert forward.shared_prefix(one) == 0
    ids = torch.tensor([[1, 2, 3, 4], [5, 2, 3, 4]])
    differ = tokenization.Batch(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    assert forward.shared_prefix(differ) == 0


def test_the_rows_are_halved_by_length_whatever_the_lengths():
    # Always two halves: under FSDP every rank calls each layer as often.
    assert forward.length_halves([300, 900, 310, 880]) == [[1, 3], [2, 0]]
    assert forward.length_halves([300, 300]) == [[0], [1]]


def test_the_one_call_packed_prefix_equals_the_three_call_path_also_under_checkpointing(tiny_dir, tokenizer):
    examples = [tokenization.encode_trajectory(tokenizer, t, 1024, True) for t in (routed_instant(), forced_agentic(), routed_instant("x"))]
    (three,) = batching.plan(examples, 0, tokenizer.eos_token_id)
    assert forward.shared_prefix(three.batch) > 0  # today's path: the prefix, then two halves from its cache
    (one,) = batching.pack(examples, 0, tokenizer.eos_token_id)
    assert one.share_prefix and one.batch.input_ids.shape[0] == 2  # [prefix, agentic rest] and [prefix, rest, rest]
    assert int((one.batch.sequence_ids == tokenization.PREFIX).sum()) == 2 * batching.common_prefix(examples)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    logprobs, loss, grads = loss_and_grads(model, three.batch)
    model.activation_checkpointing_enable()  # the three-call path cannot share a prefix here; the packed one still does
    model.train()
    assert model.get_decoder().gradient_checkpointing
    for batch in (one.batch, three.batch):
        other_logprobs, other_loss, other_grads = loss_and_grads(model, batch)
        assert torch.allclose(logprobs, other_logprobs, atol=1e-5) and torch.allclose(loss, other_loss, atol=1e-6)
        assert len(grads) == len(other_grads) > 0
        assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(grads, other_grads))
