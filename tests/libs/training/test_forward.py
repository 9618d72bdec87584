"""The shared-prefix forward pass is the same computation as decoding every row whole: equal
target log-probabilities and equal gradients, on rows of different lengths (right padding) decoded in two
halves by length."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from gearshift.testing.tensor_memory import LiveTensors
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
    assert one.share_prefix and one.batch.input_ids.shape[0] == 1  # [prefix, agentic rest, rest, rest]
    assert int((one.batch.sequence_ids == tokenization.PREFIX).sum()) == batching.common_prefix(examples)
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


def block_diagonal_mask(batch: tokenization.Batch) -> torch.Tensor:
    """The [rows, 1, W, W] mask a packed row needs on an attention without varlen: each token
    attends causally within its own sequence (the mask the packed path built before block_attention)."""
    sequences = batch.sequence_ids
    width = sequences.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    return ((sequences[:, :, None] == sequences[:, None, :]) & causal)[:, None]


def test_packing_eight_sequences_of_1k_in_blocks_holds_less_than_the_dense_mask_and_gives_its_values(tiny_dir):
    torch.manual_seed(0)
    examples = [tokenization.Encoded(torch.randint(5, 1000, (1024,)).tolist(), [False] * 24 + [True] * 1000) for _ in range(8)]
    (micro,) = batching.pack(examples, 0, 0, share_prefix=False)
    batch = micro.batch
    assert batch.input_ids.shape == (1, 8 * 1024)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)

    def hidden_and_peak(attention: dict) -> tuple[torch.Tensor, int]:
        with LiveTensors() as live:  # the mask, when the path builds one, is counted
            inputs = attention() if callable(attention) else attention
            hidden = model.get_decoder()(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False, **inputs).last_hidden_state
            hidden.pow(2).sum().backward()
        return hidden.detach(), live.peak

    dense, dense_peak = hidden_and_peak(lambda: {"attention_mask": block_diagonal_mask(batch)})
    forward.use_block_attention(model)
    blocks, blocks_peak = hidden_and_peak(forward.varlen_inputs(model, batch))
    assert torch.allclose(blocks, dense, atol=1e-5)
    print(f"peak live tensors: blocks {blocks_peak / 2**20:.1f} MiB, dense mask {dense_peak / 2**20:.1f} MiB")
    assert blocks_peak < 0.5 * dense_peak


def test_varlen_inputs_refuse_what_flash_attention_would_run_wrong():
    examples = [tokenization.Encoded([1, 2, 3, 4], [False, True, True, True]) for _ in range(2)]
    (micro,) = batching.pack(examples, 0, 0, share_prefix=False)
    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))  # its config is all that is read
    assert forward.varlen_inputs(flash, micro.batch)["cu_seq_lens_q"].tolist() == [0, 4, 8]
    two_rows = tokenization.Batch(*(torch.cat([t, t]) for t in (micro.batch.input_ids, micro.batch.attention_mask, micro.batch.target_mask,
                                                                    micro.batch.position_ids, micro.batch.sequence_ids)))
    with pytest.raises(ValueError, match="one row"):
        forward.varlen_inputs(flash, two_rows)
    prefixed = tokenization.Batch(*(t for t in (micro.batch.input_ids, micro.batch.attention_mask, micro.batch.target_mask,
                                                micro.batch.position_ids, micro.batch.sequence_ids.clone().index_fill_(1, torch.tensor([0]), tokenization.PREFIX))))
    with pytest.raises(ValueError, match="prefix"):
        forward.varlen_inputs(flash, prefixed)
    with pytest.raises(ValueError, match="needs varlen attention"):
        forward.varlen_inputs(SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager")), micro.batch)
